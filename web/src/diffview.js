// The diff page (`fxviz diff --html`, `fxviz passes --before-after`, `Diff.to_html()`, a notebook
// showing `fxviz.compare(...)`): both graphs in the same viewer, side by side, kept in step.
// Opening or closing a box opens or closes its pair; selecting a node selects its pair (hovering
// one outlines its pair); panning or zooming one side moves the other so that the pair of the
// item nearest the centre stays level with it. The `diff` overlay colours what differs on both
// sides (matched is muted). The differences are the drawer's table (findings.js), the one list
// of them on the page: a row shows its difference on both sides, its cell of one side's nodes that
// side's node. Data: fxviz/render/diffpage.py.
import { action, h, refs } from "./dom.js";
import { Findings } from "./findings.js";
import { Model } from "./model.js";
import { groupDetails, nodeDetails, renderHeader, renderLegend } from "./panels.js";
import { boxPairs, pairMaps, partnerKey } from "./pairs.js";
import { Look, bindCommon } from "./report.js";
import { layoutRunner } from "./runner.js";
import { Search, bindSearch } from "./search.js";
import { clip, grouped } from "./text.js";
import { Viewer } from "./viewer.js";

const SIDES = ["a", "b"];

function seconds(x) {
  if (x === null || x === undefined) return "";
  return x < 1 ? `${(x * 1e3).toPrecision(3).replace(/\.?0+$/, "")} ms` : `${x.toPrecision(3).replace(/\.?0+$/, "")} s`;
}

export class DiffPage {
  constructor(root, diff, run) {
    this.root = root;
    this.diff = diff;
    this.data = { name: `${diff.a.name || "model"}: ${diff.labels[0]} vs ${diff.labels[1]}` };
    root.classList.add("fx-diff-page");
    this.r = refs(root);
    this.buildPanes();
    this.r = refs(root);
    this.models = { a: new Model(diff.a), b: new Model(diff.b) };
    const nodes = pairMaps(diff.pairs);
    const boxes = boxPairs(this.models.a, this.models.b, diff.groupPairs);
    this.maps = { a: { nodes: nodes.ab, boxes: boxes.ab }, b: { nodes: nodes.ba, boxes: boxes.ba } };
    this.looks = {};
    this.viewers = {};
    this.minimaps = [];
    this.selected = null;
    this.syncing = false;
    for (const side of SIDES) {
      const model = this.models[side];
      const look = (this.looks[side] = new Look(model, diff[side].overlays));
      look.use(diff[side].overlay || "diff");
      const pane = this.r[`pane_${side}`];
      const v = (this.viewers[side] = new Viewer({
        root, svg: pane.querySelector("svg"), viewport: pane.querySelector("svg > g"), model, look, run,
        onSelect: (viewer, key) => this.onSelect(side, key),
        onView: (viewer, byUser) => byUser && this.follow(side),
        onToggle: (viewer, c, open) => this.onToggle(side, c, open),
        onError: (err) => this.fail(err),
      }));
      v.side = side;
      this.bindCanvas(side);
    }
    this.viewer = this.viewers.a;
    renderHeader(this.r, { ...diff.a, name: this.data.name, attempts: [], error: null }, () => {});
    this.r.totals.textContent = this.summaryText();
    this.r.method.textContent = SIDES.map((s) => this.captureMethod(s)).join(" vs ");
    this.r.method.title = "how each graph was captured";
    renderLegend(this.r.legend, this.models.a, this.legend());
    // the answer above the graphs and the differences as the drawer's table, as on every
    // analysis page: a row shows its difference on both sides ("d<k>"), its cell of one side's
    // nodes that side ("d<k>:a"); a node's details list the differences that name it ("a:n3").
    // The table is the page's list of differences, so it opens with the page.
    this.findings = new Findings(this.r, diff, (key) => this.goKey(key));
    if (this.findings.panels.length) this.findings.open(this.findings.panels[0].name);
    this.bindSearch();
    bindCommon(this, root);
    for (const b of root.querySelectorAll("[data-action]")) b.addEventListener("click", () => this.tool(b.dataset.action));
  }

  /** How side `side`'s graph was captured, or that its capture failed. */
  captureMethod(side) {
    const cap = (this.diff.captures || [])[side === "a" ? 0 : 1];
    const failed = this.diff.failure && this.diff.failure.side === side;
    return failed ? `${this.diff.failure.method} failed` : (cap && cap.method) || this.diff[side].method || "?";
  }

  /** One legend for both sides: the categories either side uses, once each. */
  legend() {
    const seen = new Map();
    let label = "diff";
    for (const side of SIDES) {
      const lg = this.looks[side].paint && this.looks[side].paint.legend;
      if (!lg || lg.kind !== "category") continue;
      label = lg.label;
      for (const [name, color] of lg.items) if (!seen.has(name)) seen.set(name, color);
    }
    return seen.size ? { kind: "category", label, items: [...seen] } : null;
  }

  buildPanes() {
    const canvas = this.r.canvas;
    const caps = this.diff.captures || [];
    const pane = (side, label) => {
      const cap = caps[side === "a" ? 0 : 1];
      const failure = this.diff.failure && this.diff.failure.side === side ? this.diff.failure : null;
      const facts = failure ? `${failure.method} failed`
        : cap ? [cap.method, `${grouped(cap.ops)} op${cap.ops === 1 ? "" : "s"}`, seconds(cap.seconds)].filter(Boolean).join(" · ") : "";
      const other = this.diff.labels[side === "a" ? 1 : 0];
      return h("div", { class: "fx-pane", "data-ref": `pane_${side}`, "data-side": side },
        h("div", { class: "fx-pane-title", "data-ref": `title_${side}` },
          h("span", { class: "fx-pane-label", text: label }), facts ? h("span", { class: "fx-pane-facts", text: facts }) : null),
        failure ? h("div", { class: "fx-pane-empty", role: "note" },
          h("strong", { text: `${label} could not capture this model` }),
          h("p", { text: clip(failure.reason || "", 400) }),
          h("p", { text: failure.at && failure.at.length ? `The ${other} side shows where the forward left the graph (selected).` : `The ${other} side shows what ran.` })) : null,
        (() => {
          const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
          svg.append(document.createElementNS("http://www.w3.org/2000/svg", "g"));
          return svg;
        })());
    };
    canvas.replaceChildren(h("div", { class: "fx-panes" }, pane("a", this.diff.labels[0]), pane("b", this.diff.labels[1])));
  }

  summaryText() {
    const s = this.diff.summary || {};
    const n = this.diff.differences.length;
    const sig = s.significant !== undefined ? s.significant : n;
    const info = s.informational || 0;
    return `${grouped(sig)} significant difference${sig === 1 ? "" : "s"}${info ? ` · ${grouped(info)} informational` : ""}`;
  }

  async start() {
    await Promise.all(SIDES.map((s) => this.viewers[s].firstView(this.diff[s].budget || 60)));
    // once both are drawn, side b gets a layout worker of its own: from then on the sides lay out
    // at once (expand all: 0.8x), and starting it does not delay the first view
    this.viewers.b.engine.run = layoutRunner();
    const first = this.diff.differences.find((d) => !d.informational) || this.diff.differences[0];
    if (first) await this.showDifference(first);
  }

  fail(err) {
    console.error(err); // eslint-disable-line no-console
    this.status(`Something went wrong drawing the graphs: ${err && err.message ? err.message : err}`);
  }

  status(text) {
    this.r.status.textContent = text;
    this.r.status.hidden = !text;
  }

  // ---- the differences -----------------------------------------------------------------------

  /** Show what a table row points at: difference k ("d<k>") on both sides, difference k on one
   * side ("d<k>:a", its first node there), or one side's item ("a:n3"). */
  goKey(key) {
    if (key[0] === "d") {
      const [k, side] = key.slice(1).split(":");
      const d = this.diff.differences[+k];
      if (!d) return null;
      return side && (d[side] || []).length ? this.goSide(side, d) : this.showDifference(d);
    }
    const [side, k] = key.split(":");
    return this.viewers[side] ? this.viewers[side].go(k) : null;
  }

  /** Where difference d is on side `side`: its first node there, else the box of its module call
   * there (an op only in the other graph sits in this box on this side), else null. */
  target(d, side) {
    if ((d[side] || []).length) return "n" + d[side][0];
    const box = d.at ? d.at[side === "a" ? 0 : 1] : null;
    return box === null || box === undefined ? null : "g" + box;
  }

  /** Show difference d on both sides: its first node on each (or, opened, the box where the
   * other side's nodes would be), selected, the others marked. */
  async showDifference(d) {
    const keys = Object.fromEntries(SIDES.map((s) => [s, this.target(d, s)]));
    this.syncing = true;
    try {
      // a side where the difference has no place (an op of the model's own forward only in the
      // other graph) keeps nothing selected: what was selected there is not this difference's pair
      for (const s of SIDES) if (!keys[s]) this.viewers[s].select(null, false);
      await Promise.all(SIDES.filter((s) => keys[s]).map(async (s) => {
        const v = this.viewers[s];
        // a side without the difference's nodes opens the box they would be in
        if (!(d[s] || []).length) await v.setOpen([+keys[s].slice(1)]);
        await v.go(keys[s], { mark: false });
      }));
    } finally {
      this.syncing = false;
    }
    const first = SIDES.find((s) => (d[s] || []).length) || SIDES.find((s) => keys[s]);
    if (first) {
      this.selected = { side: first, key: keys[first] };
      this.showDetails();
    }
    this.mark(d);
    this.findings.mark(`d${this.diff.differences.indexOf(d)}`);
  }

  async goSide(side, d) {
    const key = "n" + d[side][0];
    this.syncing = true;
    try {
      await this.viewers[side].go(key, { mark: false });
    } finally {
      this.syncing = false;
    }
    this.selected = { side, key };
    this.showDetails();
    this.mark(d);
    this.findings.mark(`d${this.diff.differences.indexOf(d)}`);
  }

  /** Mark every node of difference d on both sides. */
  mark(d) {
    for (const side of SIDES) {
      const vp = this.viewers[side].scene.viewport;
      for (const el of vp.querySelectorAll(".fx-diff-hit")) el.classList.remove("fx-diff-hit");
      for (const i of d[side] || []) {
        const el = vp.querySelector(`[data-key="${this.models[side].repOfNode(i)}"]`);
        if (el) el.classList.add("fx-diff-hit");
      }
    }
  }

  // ---- keeping the sides in step ---------------------------------------------------------------

  other(side) {
    return side === "a" ? "b" : "a";
  }

  onSelect(side, key) {
    // a selection that follows the other side's keeps the details of what the user chose
    if (this.syncing) return;
    this.selected = { side, key };
    this.showDetails();
    if (this.findings) this.findings.mark(key ? `${side}:${key}` : null);
    if (!key) return;
    const partner = partnerKey(key, this.maps[side].nodes, this.maps[side].boxes);
    if (!partner) return;
    this.syncing = true;
    this.viewers[this.other(side)].go(partner, { mark: false }).finally(() => { this.syncing = false; });
  }

  onToggle(side, c, open) {
    if (this.opening) return;
    const partner = this.maps[side].boxes.get(c);
    if (partner === undefined) return;
    const v = this.viewers[this.other(side)];
    this.opening = true;
    const done = open ? v.setOpen([partner]) : v.setOpen([], [partner]);
    done.finally(() => {
      this.opening = false;
      this.follow(side);
    });
  }

  /** Move the other side so that the pair of the item nearest this side's centre is level
   * with it, at the same zoom. */
  follow(side) {
    if (this.syncing || this.following) return;
    this.following = true;
    requestAnimationFrame(() => {
      this.following = false;
      const v = this.viewers[side];
      const w = this.viewers[this.other(side)];
      const [vw, vh] = v.pz.size();
      const [cx, cy] = v.pz.toGraph(vw / 2, vh / 2);
      let best = null;
      for (const r of v.drawnRects()) {
        if (r.open) continue;
        const partner = partnerKey(r.key, this.maps[side].nodes, this.maps[side].boxes);
        const shown = partner && w.model.repOf(partner);
        if (!shown || !w.drawn(shown)) continue;
        const d = Math.hypot(r.x + r.w / 2 - cx, r.y + r.h / 2 - cy);
        if (!best || d < best.d) best = { d, r, shown };
      }
      if (!best) {
        w.pz.set(v.pz.x, v.pz.y, v.pz.k);
        return;
      }
      const [sx, sy] = v.pz.toScreen(best.r.x + best.r.w / 2, best.r.y + best.r.h / 2);
      const o = w.engine.rect(best.shown);
      const k = v.pz.k;
      w.pz.set(sx - (o.x + o.w / 2) * k, sy - (o.y + o.h / 2) * k, k);
    });
  }

  // ---- panels and tools ----------------------------------------------------------------------

  showDetails() {
    if (!this.selected || !this.selected.key) return;
    const { side, key } = this.selected;
    const model = this.models[side];
    const go = (k) => this.viewers[side].go(k);
    const opts = { overlays: this.diff[side].overlays, linkPattern: this.settings ? this.settings.link : "" };
    const body = key[0] === "n" ? nodeDetails(model, +key.slice(1), go, opts) : groupDetails(model, +key.slice(1), go, opts);
    const other = this.other(side);
    const partner = partnerKey(key, this.maps[side].nodes, this.maps[side].boxes);
    const otherLabel = this.diff.labels[other === "a" ? 0 : 1];
    const pair = partner
      ? action(this.label(other, partner), () => this.viewers[other].go(partner), { class: "fx-diff-pair", "data-side": other, "data-key": partner })
      : h("span", { class: "fx-diff-none", text: "none" });
    body.prepend(h("p", { class: "fx-diff-side" }, `in ${this.diff.labels[side === "a" ? 0 : 1]} · pair in ${otherLabel}: `, pair));
    this.r.details.replaceChildren(body);
    const facts = this.findings && this.findings.facts(`${side}:${key}`);
    if (facts) this.r.details.append(facts);
  }

  bindSearch() {
    const searches = { a: new Search(this.models.a), b: new Search(this.models.b) };
    const both = {
      find: (q, re) => {
        const ra = searches.a.find(q, re);
        const rb = searches.b.find(q, re);
        const tag = (side) => (e) => ({ ...e, key: `${side}:${e.key}`, module: `${this.diff.labels[side === "a" ? 0 : 1]} · ${e.box ? "modules" : e.module || "(model)"}`, box: false });
        return { hits: [...ra.hits.map(tag("a")), ...rb.hits.map(tag("b"))], error: ra.error || rb.error };
      },
    };
    bindSearch({ input: this.r.search, list: this.r.results, count: this.r.count, regex: this.r.regex }, both, (key) => {
      const [side, k] = key.split(":");
      this.viewers[side].go(k);
    });
  }

  /** A node's or box's label on side `side` ("n12" / "g3"). */
  label(side, key) {
    return clip(this.models[side].labelOf(key) || "", 60);
  }

  /** Outline the drawn pair of `key` (on side `side`) on the other side; null clears it. */
  hoverPair(side, key) {
    const w = this.viewers[this.other(side)];
    for (const el of w.scene.viewport.querySelectorAll(".fx-pair-hover")) el.classList.remove("fx-pair-hover");
    const partner = key && partnerKey(key, this.maps[side].nodes, this.maps[side].boxes);
    const shown = partner && w.model.repOf(partner);
    if (!shown) return;
    const el = w.scene.viewport.querySelector(`[data-key="${shown}"]`);
    if (el) el.classList.add("fx-pair-hover");
  }

  bindCanvas(side) {
    const v = this.viewers[side];
    const svg = v.svg;
    const keyOf = (t) => {
      const el = t.closest && t.closest("[data-key]");
      return el && svg.contains(el) ? el.dataset.key : null;
    };
    svg.addEventListener("mouseover", (ev) => this.hoverPair(side, keyOf(ev.target)));
    svg.addEventListener("mouseleave", () => this.hoverPair(side, null));
    svg.addEventListener("click", (ev) => {
      if (v.pz.dragged) return;
      const far = ev.target.closest && ev.target.closest("[data-go]");
      if (far) return v.go(far.dataset.go);
      const key = keyOf(ev.target);
      if (!key) return;
      if (key[0] === "g" && ev.target.classList.contains("fx-toggle")) v.toggle(+key.slice(1));
      else v.select(key, false);
    });
    svg.addEventListener("dblclick", (ev) => {
      const key = keyOf(ev.target);
      if (key && key[0] === "g") v.toggle(+key.slice(1));
      ev.preventDefault();
    });
  }

  tool(name) {
    const all = (fn) => SIDES.forEach((s) => fn(this.viewers[s]));
    const actions = {
      "zoom-in": () => { this.viewers.a.pz.zoomCenter(1.25); this.follow("a"); },
      "zoom-out": () => { this.viewers.a.pz.zoomCenter(0.8); this.follow("a"); },
      fit: () => all((v) => v.fit()),
      collapse: () => all((v) => v.collapseAll()),
      expand: () => all((v) => v.expandAll()),
    };
    if (actions[name]) actions[name]();
  }
}

