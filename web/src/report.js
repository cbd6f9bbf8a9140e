// The report page: one viewer and the panels around it (header, search, module tree, overview,
// details, legend), the keyboard, the overlay switch, the theme, export, and the view's state
// in the URL. diffview.js builds the diff page from the same parts.
import { h, refs } from "./dom.js";
import { exportPng, exportSvg } from "./exporter.js";
import { Minimap } from "./minimap.js";
import { Model, ROOT } from "./model.js";
import { MISSING, inkFor, painter } from "./overlay.js";
import { groupDetails, markInTree, nodeDetails, renderHeader, renderLegend, renderTree, syncTree } from "./panels.js";
import { Findings } from "./findings.js";
import { Search, bindSearch } from "./search.js";
import { LINK_PATTERNS, loadSettings, resolvedTheme, saveSettings } from "./settings.js";
import { BoxNames, decodeState, encodeState } from "./state.js";
import { PHASE_CHOICES, hasPhases, hiddenKeys } from "./phase.js";
import { grouped } from "./text.js";
import { EXPAND_ALL_MAX, Viewer, afterPaint, busyUntil, idle } from "./viewer.js";

/** How a viewer colours its items: the op-family colours, or the current overlay's. */
export class Look {
  constructor(model, overlays) {
    this.model = model;
    this.overlays = overlays || [];
    this.current = null;
    this.paint = null;
    this.scale = null;
  }

  use(name, scale = null) {
    this.current = this.overlays.find((o) => o.name === name) || null;
    this.scale = this.current && this.current.kind === "number" ? scale || this.current.scale || "linear" : null;
    this.paint = painter(this.current, this.scale);
  }

  node(i) {
    if (!this.paint) {
      const c = this.model.color(i);
      return { fill: c, ink: inkFor(c) };
    }
    const col = this.paint.color((this.current.nodes || [])[i]);
    return col ? { fill: col, ink: inkFor(col) } : { fill: MISSING, ink: "#1f2937", none: true };
  }

  box(c) {
    if (!this.paint) return null;
    const v = c < this.model.real ? (this.current.groups || [])[c] : null;
    const col = this.paint.color(v);
    return col ? { fill: col } : { fill: MISSING, none: true };
  }
}

/** The tools shared by the report and the diff page: theme, settings, export. */
export function bindCommon(app, root) {
  const r = app.r;
  app.settings = loadSettings();
  const applyTheme = () => {
    const t = resolvedTheme(app.settings.theme);
    root.dataset.theme = t;
    document.documentElement.dataset.theme = t;
    if (r.theme) r.theme.textContent = { auto: "◐ auto", light: "☀ light", dark: "☾ dark" }[app.settings.theme];
  };
  applyTheme();
  try {
    window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", applyTheme);
  } catch {
    // an old browser: the theme follows the switch only
  }
  if (r.theme) {
    r.theme.addEventListener("click", () => {
      app.settings.theme = { auto: "light", light: "dark", dark: "auto" }[app.settings.theme] || "auto";
      saveSettings(app.settings);
      applyTheme();
      if (app.minimaps) app.minimaps.forEach((m) => m.redraw());
    });
  }
  if (r.links) {
    r.links.replaceChildren(...Object.entries(LINK_PATTERNS).map(([k, v]) => h("option", { value: v, text: k === "off" ? "links: off" : `links: ${k}` })));
    if (!Object.values(LINK_PATTERNS).includes(app.settings.link)) r.links.append(h("option", { value: app.settings.link, text: `links: ${app.settings.link}` }));
    r.links.value = app.settings.link;
    r.links.addEventListener("change", () => {
      app.settings.link = r.links.value;
      saveSettings(app.settings);
      app.showDetails();
    });
  }
  if (r.more) {
    // the ⋯ menu closes on a click elsewhere, on Escape, and once the drawing is saved
    const shut = () => r.more.removeAttribute("open");
    document.addEventListener("pointerdown", (e) => { if (!r.more.contains(e.target)) shut(); });
    r.more.addEventListener("keydown", (e) => {
      if (e.key !== "Escape" || !r.more.open) return;
      shut();
      r.more.querySelector("summary").focus();
    });
    for (const b of [r.exportSvg, r.exportPng]) if (b) b.addEventListener("click", shut);
  }
  const css = () => [...document.querySelectorAll("style")].map((s) => s.textContent).join("\n");
  const name = () => (app.data.name || "graph").replace(/[^\w.-]+/g, "_").slice(0, 80) || "graph";
  if (r.exportSvg) r.exportSvg.addEventListener("click", () => exportSvg(app.viewer, css(), root.dataset.theme, name()));
  if (r.exportPng) r.exportPng.addEventListener("click", () => exportPng(app.viewer, css(), root.dataset.theme, name()).catch((e) => app.status(String(e.message || e))));
}

export class Report {
  /** `later` resolves when the page has read the data's second block (each node's attributes,
   * the values of overlays the report does not open with: main.js merges it into `data`); the
   * page is busy until then, and details and colourings wait for it. */
  constructor(root, data, run, later = Promise.resolve()) {
    performance.mark("fxviz:boot");
    this.root = root;
    this.data = data;
    this.laterRead = false;
    this.later = busyUntil(root, later.then(() => (this.laterRead = true)));
    this.later.catch((err) => this.fail(err));
    this.r = refs(root);
    this.model = new Model(data);
    this.look = new Look(this.model, data.overlays);
    this.query = "";
    this.viewer = new Viewer({
      root, svg: this.r.svg, viewport: this.r.viewport, model: this.model, look: this.look, run,
      onSelect: (v, key) => this.onSelect(key),
      onView: (v, byUser) => this.onView(byUser),
      onToggle: () => this.saveState(),
      onDraw: () => this.afterDraw(),
      onError: (err) => this.fail(err),
    });
    this.minimaps = [new Minimap(this.r.minimap, this.viewer)];
    renderHeader(this.r, data, () => this.showErrors());
    renderTree(this.r.tree, this.model, (key) => this.viewer.go(key));
    this.bindFindings();
    this.search = bindSearch({ input: this.r.search, list: this.r.results, count: this.r.count, regex: this.r.regex },
      new Search(this.model), (key) => this.viewer.go(key), (q) => { this.query = q; this.saveState(); });
    bindCommon(this, root);
    this.bindOverlays();
    this.bindPhase();
    this.bindCanvas();
    this.bindKeys();
    this.bindTools();
    this.watchSize();
    window.addEventListener("hashchange", () => this.restore(location.hash));
  }

  /** Every box's name for the URL (state.js): made while the page is idle after the first
   * view (`nameWhenIdle`), or all at once when a link is read or written before. */
  get names() {
    if (!this.boxNames) this.boxNames = new BoxNames(this.model);
    this.boxNames.step();
    return this.boxNames;
  }

  /** Make the boxes' names a few milliseconds at a time while the page is idle. */
  nameWhenIdle() {
    if (!this.boxNames) this.boxNames = new BoxNames(this.model);
    const slice = (deadline) => {
      if (!this.boxNames.step(Math.min(8, deadline.timeRemaining()))) idle(slice);
    };
    idle(slice);
  }

  /** The first view, or the view a link's hash describes; resolves once it is drawn. */
  async start() {
    // the boxes' names are made only when there is a link to read
    const state = decodeState(location.hash, this.model, location.hash ? this.names : null);
    // a link's colouring may need values the second block holds
    if (state.overlay && state.overlay !== this.data.overlay) await this.later;
    const failing = this.errorNodes();
    this.usePhase(state.phase);
    if (state.overlay || state.scale) this.useOverlay(state.overlay, state.scale, false);
    else if (this.data.overlay) this.useOverlay(this.data.overlay, null, false);
    else this.useOverlay(null, null, false);
    if (state.open.length || state.selected) {
      await this.viewer.setOpen(state.open);
      this.viewer.readableFit();
      if (state.selected) await this.viewer.go(state.selected, { mark: false });
    } else {
      const open = failing.length ? this.model.ancestors(this.model.ng[failing[0]]) : [];
      await this.viewer.firstView(this.data.budget || 60, open);
      if (failing.length) this.viewer.select("n" + failing[0], false);
    }
    if (state.query) this.search.set(state.query);
    this.nameWhenIdle();
  }

  /** After each drawing: the overview, and the module tree follows what is open once the
   * graph is on screen and the page is idle (a change outside the graph lays the whole page
   * out again, the graph with it: not in the way of drawing it). */
  /** The toolbar's forward / backward / both choice (phase.js), on a training step's graph only. */
  bindPhase() {
    this.phase = "both";
    const el = this.r.phase;
    if (!el || !hasPhases(this.data)) return;
    this.viewer.onUnhide = () => { // a search or a table row went to an op of the hidden pass
      this.phase = el.value = "both";
      this.saveState();
    };
    el.replaceChildren(...PHASE_CHOICES.map((c) => h("option", { value: c, text: c === "both" ? "forward + backward" : `${c} only` })));
    el.hidden = false;
    el.addEventListener("change", () => {
      this.usePhase(el.value);
      this.saveState();
    });
  }

  usePhase(choice) {
    if (!this.r.phase || this.r.phase.hidden) return;
    this.phase = PHASE_CHOICES.includes(choice) ? choice : "both";
    this.r.phase.value = this.phase;
    const keys = hiddenKeys(this.data, this.phase);
    if (keys.size || this.model.hidden.size) this.viewer.setHidden(keys);
  }

  afterDraw() {
    for (const m of this.minimaps) m.redraw();
    if (this.treeQueued) return;
    this.treeQueued = true;
    busyUntil(this.root, new Promise((resolve) => afterPaint(() => idle(() => {
      this.treeQueued = false;
      syncTree(this.r.tree, this.model);
      resolve();
    }))));
  }

  fail(err) {
    console.error(err); // eslint-disable-line no-console
    this.status(`Something went wrong drawing the graph: ${err && err.message ? err.message : err}`);
  }

  status(text) {
    this.r.status.textContent = text;
    this.r.status.hidden = !text;
  }

  errorNodes() {
    return this.model.errorNodes();
  }

  showErrors() {
    const failing = this.errorNodes();
    if (failing.length) this.viewer.go("n" + failing[0]);
  }

  onSelect(key) {
    this.selected = key;
    if (key && !this.viewer.drawn(key)) {
      const m = this.model;
      this.status(`${m.labelOf(key)} is nested deeper than the drawing goes: it is inside the marked box ${m.labelOf(m.repOf(key))}; its details are on the right.`);
    } else if (this.r.status.textContent.includes("nested deeper")) this.status("");
    this.showDetails();
    markInTree(this.r.tree, this.model, key && key[0] === "g" ? +key.slice(1) : key ? this.model.ng[+key.slice(1)] : null);
    if (this.findings) this.findings.mark(key);
    this.saveState();
  }

  /** The analysis's answer above the graph and its tables in the drawer under it (findings.js). */
  bindFindings() {
    this.findings = new Findings(this.r, this.data, (key) => this.viewer.go(key));
  }

  /** The rows of the analysis's tables that point at `key`, for its details (null: none). */
  findingsOf(key) {
    return this.findings ? this.findings.facts(key) : null;
  }

  showDetails() {
    const key = this.selected;
    if (!key) return;
    if (!this.laterRead) {
      // the attributes and overlay values are in the block the page is still reading
      this.later.then(() => this.showDetails());
      return;
    }
    const go = (k) => this.viewer.go(k);
    const opts = { overlays: this.data.overlays, linkPattern: this.settings.link };
    this.r.details.replaceChildren(key[0] === "n" ? nodeDetails(this.model, +key.slice(1), go, opts) : groupDetails(this.model, +key.slice(1), go, opts));
    const facts = this.findingsOf(key);
    if (facts) this.r.details.append(facts);
  }

  onView() {
    for (const m of this.minimaps) m.view();
  }

  // ---- the URL -------------------------------------------------------------------------------

  saveState() {
    clearTimeout(this.saveTimer);
    this.saveTimer = setTimeout(() => {
      const text = encodeState({ selected: this.selected, open: this.model.expanded, overlay: this.look.current && this.look.current.name,
        scale: this.look.scale && this.look.current && this.look.scale !== this.look.current.scale ? this.look.scale : null, query: this.query,
        phase: this.phase }, this.model, this.names);
      try {
        history.replaceState(null, "", text ? "#" + text : location.pathname + location.search);
      } catch {
        // a sandboxed frame may not change its URL
      }
    }, 150);
  }

  async restore(hash) {
    await this.later;
    const state = decodeState(hash, this.model, this.names);
    this.usePhase(state.phase);
    this.useOverlay(state.overlay, state.scale);
    const keep = new Set(state.open);
    await this.viewer.setOpen(state.open, [...this.model.expanded].filter((g) => !keep.has(g)));
    if (state.selected) await this.viewer.go(state.selected, { mark: false });
  }

  // ---- overlays ------------------------------------------------------------------------------

  bindOverlays() {
    const ovs = this.data.overlays || [];
    this.r.overlay.replaceChildren(h("option", { value: "", text: "colour: op kind" }), ...ovs.map((o) => h("option", { value: o.name, text: `colour: ${o.label || o.name}` })));
    this.r.overlay.hidden = !ovs.length;
    this.r.overlay.addEventListener("change", () => this.later.then(() => this.useOverlay(this.r.overlay.value || null, null)));
    this.r.scale.addEventListener("click", () => {
      if (this.look.current) this.useOverlay(this.look.current.name, this.look.scale === "log" ? "linear" : "log");
    });
  }

  /** Colour the graph by overlay `name` (null: op kinds) on `scale`, and say so in the legend. */
  useOverlay(name, scale, redraw = true) {
    this.look.use(name, scale);
    const ov = this.look.current;
    this.r.overlay.value = ov ? ov.name : "";
    this.r.scale.hidden = !(ov && ov.kind === "number");
    this.r.scale.textContent = this.look.scale === "log" ? "log scale" : "linear scale";
    this.root.dataset.overlay = ov ? ov.name : "";
    this.root.classList.toggle("fx-ov", Boolean(ov));
    renderLegend(this.r.legend, this.model, this.look.paint && this.look.paint.legend);
    if (redraw) {
      this.viewer.scene.invalidate();
      this.viewer.schedule(() => this.viewer.refresh());
      this.saveState();
    }
  }

  // ---- input ---------------------------------------------------------------------------------

  keyOf(target) {
    const el = target.closest && target.closest("[data-key]");
    return el && this.r.viewport.contains(el) ? el.dataset.key : null;
  }

  bindCanvas() {
    const svg = this.r.svg;
    const v = this.viewer;
    svg.addEventListener("click", (ev) => {
      if (v.pz.dragged) return;
      // a stub's label names the other end of its edge: go there
      const far = ev.target.closest && ev.target.closest("[data-go]");
      if (far) return v.go(far.dataset.go);
      const key = this.keyOf(ev.target);
      if (!key) return;
      // the +/− mark on a box toggles it with one click
      if (key[0] === "g" && ev.target.classList.contains("fx-toggle")) v.toggle(+key.slice(1));
      else v.select(key, false);
    });
    svg.addEventListener("dblclick", (ev) => {
      const key = this.keyOf(ev.target);
      if (key && key[0] === "g") v.toggle(+key.slice(1));
      ev.preventDefault();
    });
  }

  /** Move the selection along the data flow: to a producer ("up") or a consumer ("down") of the
   * selected item, as it is drawn; "next" steps to the other producers or consumers of the item
   * the last move started from. */
  step(dir) {
    const m = this.model;
    const v = this.viewer;
    const key = this.selected;
    if (!key) return;
    if (dir === "next" || dir === "prev") {
      const nav = this.nav;
      if (!nav || nav.at !== key || nav.options.length < 2) return;
      nav.index = (nav.index + (dir === "next" ? 1 : nav.options.length - 1)) % nav.options.length;
      nav.at = nav.options[nav.index];
      v.go(nav.at);
      return;
    }
    const nodes = key[0] === "n" ? [+key.slice(1)] : [...m.subtreeNodes(+key.slice(1))];
    const inside = new Set(nodes);
    const found = [];
    for (const i of nodes) {
      const next = dir === "up" ? m.inputs(i).map(([s]) => s) : m.users(i);
      for (const j of next) if (!inside.has(j)) found.push(m.repOfNode(j));
    }
    const options = [...new Set(found)];
    if (!options.length) return;
    this.nav = { from: key, options, index: 0, at: options[0] };
    v.go(options[0]);
  }

  bindKeys() {
    document.addEventListener("keydown", (ev) => {
      const t = ev.target;
      if (t && (t.tagName === "INPUT" || t.tagName === "TEXTAREA" || t.tagName === "SELECT")) return;
      const v = this.viewer;
      const pz = v.pz;
      const step = 60;
      const shifted = {
        ArrowUp: () => this.step("up"),
        ArrowDown: () => this.step("down"),
        ArrowRight: () => this.step("next"),
        ArrowLeft: () => this.step("prev"),
      };
      const keys = {
        "/": () => this.r.search.focus(),
        "+": () => pz.zoomCenter(1.25),
        "=": () => pz.zoomCenter(1.25),
        "-": () => pz.zoomCenter(0.8),
        f: () => v.fit(),
        0: () => v.fit(),
        ArrowLeft: () => pz.panBy(step, 0),
        ArrowRight: () => pz.panBy(-step, 0),
        ArrowUp: () => pz.panBy(0, step),
        ArrowDown: () => pz.panBy(0, -step),
        "[": () => this.step("up"),
        "]": () => this.step("down"),
        Enter: () => this.selected && this.selected[0] === "g" && v.toggle(+this.selected.slice(1)),
        Escape: () => this.r.results && (this.r.results.hidden = true),
      };
      const fn = ev.shiftKey && shifted[ev.key] ? shifted[ev.key] : keys[ev.key];
      if (fn && !ev.ctrlKey && !ev.metaKey && !ev.altKey) {
        fn();
        ev.preventDefault();
      }
    });
  }

  bindTools() {
    const v = this.viewer;
    const actions = {
      "zoom-in": () => v.pz.zoomCenter(1.25),
      "zoom-out": () => v.pz.zoomCenter(0.8),
      fit: () => v.fit(),
      collapse: () => v.collapseAll().then(() => this.saveState()),
      expand: () => v.expandAll().then((left) => {
        this.status(left ? `Opened boxes until ${grouped(EXPAND_ALL_MAX)} items were drawn; ${grouped(left)} boxes stay closed (open them one by one, or search).` : "");
        this.saveState();
      }),
    };
    for (const b of this.root.querySelectorAll("[data-action]")) b.addEventListener("click", () => actions[b.dataset.action]());
    this.r.sideToggle.addEventListener("click", () => this.root.classList.toggle("fx-side-open"));
  }

  /** Refit when the page gets its size late (a notebook's frame) or changes size, unless the
   * reader has moved the view since. */
  watchSize() {
    if (typeof ResizeObserver !== "function") return;
    let last = [0, 0];
    new ResizeObserver(() => {
      const size = this.viewer.pz.size();
      if (size[0] === last[0] && size[1] === last[1]) return;
      last = size;
      if (!this.viewer.engine.result(ROOT)) return;
      if (!this.viewer.fitted || !this.viewer.pz.moved) this.viewer.readableFit();
      for (const m of this.minimaps) m.redraw();
    }).observe(this.r.svg);
  }
}

