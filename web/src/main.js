// The fxviz report: reads the embedded view-model, lays out the visible part of the graph with
// dagre and draws it as SVG. Expanding or collapsing a module box re-lays out and keeps the box
// where it was on screen. Performance marks ("fxviz:first-paint", "fxviz:expand") time it.
import { refs } from "./dom.js";
import { defs, draw, leafSize } from "./draw.js";
import { layout } from "./layout.js";
import { Model } from "./model.js";
import { groupDetails, nodeDetails, renderHeader, renderLegend, renderTree } from "./panels.js";
import { PanZoom } from "./panzoom.js";
import { Search, bindSearch } from "./search.js";

performance.mark("fxviz:start");

/** Run fn once the frame with the current DOM has been painted (the frame after the next). */
function afterPaint(fn) {
  requestAnimationFrame(() => requestAnimationFrame(fn));
}

class App {
  constructor(root, data) {
    this.root = root;
    this.r = refs(root);
    this.model = new Model(data);
    this.selected = null;
    this.lay = null;
    this.layouts = 0;
    this.sizes = new Map();
    this.r.svg.prepend(defs());
    this.pz = new PanZoom(this.r.svg, this.r.viewport);

    renderHeader(this.r, data, () => this.showErrors());
    renderLegend(this.r.legend, this.model);
    renderTree(this.r.tree, data, (path) => this.goToPath(path));
    bindSearch(this.r.search, this.r.results, new Search(this.model), (key) => this.go(key));
    this.bindCanvas();
    this.bindKeys();
    this.bindTools();

    this.model.expandToBudget(data.budget);
    const failing = this.errorNodes();
    failing.forEach((i) => this.model.revealNode(i));
    this.relayout();
    this.fit();
    if (failing.length) this.select("n" + failing[0], false);
  }

  errorNodes() {
    return this.model.nodes.flatMap((n, i) => (n.e ? [i] : []));
  }

  size(key) {
    let v = this.sizes.get(key);
    if (!v) this.sizes.set(key, (v = leafSize(this.model, key)));
    return v;
  }

  /** Lay out and draw what the model says is visible. */
  relayout() {
    performance.mark("fxviz:layout-start");
    this.view = this.model.visibleGraph();
    this.lay = layout(this.model, this.view, (key) => this.size(key));
    this.layouts += 1;
    performance.mark("fxviz:layout-end");
    draw(this.r.viewport, this.model, this.view, this.lay, this.selected);
    performance.mark("fxviz:draw-end");
    // the phases of the last re-layout, for the benchmark
    performance.measure("fxviz:layout", "fxviz:layout-start", "fxviz:layout-end");
    performance.measure("fxviz:draw", "fxviz:layout-end", "fxviz:draw-end");
    this.root.dataset.layouts = String(this.layouts);
  }

  fit() {
    this.pz.fit(0, 0, this.lay.width, this.lay.height);
  }

  /** Toggle box c, keeping its top edge at the same place on screen. */
  toggle(c) {
    performance.mark("fxviz:expand-start");
    const key = "g" + c;
    const before = this.lay.pos.get(key);
    const [sx, sy] = this.pz.toScreen(before.x, before.y - before.height / 2);
    if (this.model.expanded.has(c)) this.model.collapse(c);
    else this.model.expanded.add(c);
    this.relayout();
    const after = this.lay.pos.get(key);
    if (after) {
      this.pz.x = sx - after.x * this.pz.k;
      this.pz.y = sy - (after.y - after.height / 2) * this.pz.k;
      this.pz.apply();
    }
    this.select(key, false);
    afterPaint(() => {
      performance.mark("fxviz:expand-end");
      performance.measure("fxviz:expand", "fxviz:expand-start", "fxviz:expand-end");
    });
  }

  /** Show a node or box in the details panel and mark it; center on it if asked. */
  select(key, center = true) {
    this.selected = key;
    for (const el of this.r.viewport.querySelectorAll(".fx-selected")) el.classList.remove("fx-selected");
    for (const el of this.r.viewport.querySelectorAll(".fx-linked")) el.classList.remove("fx-linked");
    const el = this.r.viewport.querySelector(`[data-key="${key}"]`);
    if (el) el.classList.add("fx-selected");
    for (const e of this.r.viewport.querySelectorAll(`[data-from="${key}"], [data-to="${key}"]`)) e.classList.add("fx-linked");
    const go = (k) => this.go(k);
    const body = key[0] === "n" ? nodeDetails(this.model, +key.slice(1), go) : groupDetails(this.model, +key.slice(1), go);
    this.r.details.replaceChildren(body);
    for (const a of this.r.tree.querySelectorAll(".fx-tree-current")) a.classList.remove("fx-tree-current");
    const path = key[0] === "g" ? this.model.groups[+key.slice(1)].path : null;
    if (path !== null) {
      const item = this.r.tree.querySelector(`[data-path="${CSS.escape(path)}"]`);
      if (item) item.classList.add("fx-tree-current");
    }
    if (center && this.lay.pos.has(key)) {
      const p = this.lay.pos.get(key);
      this.pz.centerOn(p.x, p.y);
      if (el) {
        el.classList.remove("fx-flash");
        void el.getBBox();
        el.classList.add("fx-flash");
      }
    }
  }

  /** Reveal a node ("n12") or box ("g3"), expanding what hides it, then select it. */
  go(key) {
    const m = this.model;
    const changed = key[0] === "n" ? m.revealNode(+key.slice(1)) : m.revealGroup(+key.slice(1));
    if (changed) this.relayout();
    this.select(key, true);
  }

  goToPath(path) {
    const m = this.model;
    let c = m.groups.findIndex((g) => g.path === path && !g.run && !g.io);
    if (c < 0) return;
    // a run member that is still folded is shown as its run
    const hiding = m.hidingGroup(m.groups[c].p);
    this.go("g" + c);
    if (hiding >= 0 && !m.expanded.has(hiding)) this.go("g" + hiding);
  }

  showErrors() {
    const failing = this.errorNodes();
    if (failing.length) this.go("n" + failing[0]);
  }

  collapseAll() {
    this.model.expanded.clear();
    this.relayout();
    this.fit();
  }

  keyOf(target) {
    const el = target.closest && target.closest("[data-key]");
    return el && this.r.viewport.contains(el) ? el.dataset.key : null;
  }

  bindCanvas() {
    const svg = this.r.svg;
    svg.addEventListener("click", (ev) => {
      if (this.pz.dragged) return;
      // a stub's label names the other end of its edge: go there
      const far = ev.target.closest && ev.target.closest("[data-go]");
      if (far) return this.go(far.dataset.go);
      const key = this.keyOf(ev.target);
      if (!key) return;
      // the +/− mark on a box toggles it with one click
      if (key[0] === "g" && ev.target.classList.contains("fx-toggle")) this.toggle(+key.slice(1));
      else this.select(key, false);
    });
    svg.addEventListener("dblclick", (ev) => {
      const key = this.keyOf(ev.target);
      if (key && key[0] === "g") this.toggle(+key.slice(1));
      ev.preventDefault();
    });
  }

  bindKeys() {
    document.addEventListener("keydown", (ev) => {
      const t = ev.target;
      if (t && (t.tagName === "INPUT" || t.tagName === "TEXTAREA")) return;
      const step = 60;
      const keys = {
        "/": () => this.r.search.focus(),
        "+": () => this.pz.zoomCenter(1.25),
        "=": () => this.pz.zoomCenter(1.25),
        "-": () => this.pz.zoomCenter(0.8),
        f: () => this.fit(),
        0: () => this.fit(),
        ArrowLeft: () => this.pz.panBy(step, 0),
        ArrowRight: () => this.pz.panBy(-step, 0),
        ArrowUp: () => this.pz.panBy(0, step),
        ArrowDown: () => this.pz.panBy(0, -step),
        Enter: () => this.selected && this.selected[0] === "g" && this.toggle(+this.selected.slice(1)),
        Escape: () => this.r.results && (this.r.results.hidden = true),
      };
      const fn = keys[ev.key];
      if (fn && !ev.ctrlKey && !ev.metaKey && !ev.altKey) {
        fn();
        ev.preventDefault();
      }
    });
  }

  bindTools() {
    const actions = {
      "zoom-in": () => this.pz.zoomCenter(1.25),
      "zoom-out": () => this.pz.zoomCenter(0.8),
      fit: () => this.fit(),
      collapse: () => this.collapseAll(),
    };
    for (const b of this.root.querySelectorAll("[data-action]")) b.addEventListener("click", () => actions[b.dataset.action]());
  }
}

function boot() {
  const root = document.getElementById("fxviz-app");
  const data = JSON.parse(document.getElementById("fxviz-data").textContent);
  const app = new App(root, data);
  // a handle for the browser tests and the console; nothing else reads it
  window.fxvizReport = app;
  afterPaint(() => {
    performance.mark("fxviz:first-paint");
    // from navigation start: reading the file and parsing the JSON count too
    performance.measure("fxviz:first-paint", { start: 0, end: "fxviz:first-paint" });
    root.dataset.ready = "true";
  });
}

if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", boot);
else boot();
