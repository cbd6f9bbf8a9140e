// SVG drawing, one level at a time. Each open box is a <g> in the coordinates of its own top-left
// corner, holding its frame, title, edges, closed items and the <g>s of the open boxes inside
// it, placed by a transform. A level's <g> is kept as long as its layout key is (engine.js): a
// toggle rebuilds the toggled box and the boxes around it, and moves the others as blocks.
// Every element carries data-* attributes naming what it shows, which the click handlers and the
// browser tests read.
import { s } from "./dom.js";
import { MAX_DEPTH, ROOT } from "./model.js";
import { FONTS, STUB, boxSubtitle, boxTitle, nodeText, stubText } from "./sizes.js";
import { visible } from "./text.js";

/** Smooth path through flat points [x0, y0, x1, y1, ...]: straight segments joined by
 * quadratic corners. */
export function edgePath(p) {
  const n = p.length / 2;
  if (n < 3) return `M${p[0]},${p[1]}L${p[2 * n - 2]},${p[2 * n - 1]}`;
  let d = `M${p[0]},${p[1]}`;
  for (let i = 1; i < n - 1; i++) {
    const [x, y, nx, ny] = [p[2 * i], p[2 * i + 1], p[2 * i + 2], p[2 * i + 3]];
    d += i === n - 2 ? `Q${x},${y} ${nx},${ny}` : `Q${x},${y} ${(x + nx) / 2},${(y + ny) / 2}`;
  }
  return d;
}

const r1 = (x) => Math.round(x * 10) / 10;

export class Scene {
  /** `look`: `{ node(i) -> {fill, ink, none}, box(c) -> {fill, none} | null }` (overlay.js). */
  constructor(viewport, model, engine, look) {
    this.viewport = viewport;
    this.m = model;
    this.e = engine;
    this.look = look;
    this.els = new Map();
    this.selected = null;
    this.built = 0;
  }

  /** Draw what the engine laid out; rebuild only levels whose layout changed. */
  draw() {
    this.built = 0;
    const el = this.level(ROOT);
    if (this.viewport.firstChild !== el) this.viewport.replaceChildren(el);
    for (const c of [...this.els.keys()]) if (c !== ROOT && !this.m.expanded.has(c)) this.els.delete(c);
  }

  /** Forget every level's drawing (the colours changed). */
  invalidate() {
    this.els.clear();
  }

  level(c) {
    const key = this.e.key(c);
    const old = this.els.get(c);
    if (old && old.key === key) return old.el;
    const el = this.build(c);
    this.els.set(c, { key, el });
    this.built += 1;
    return el;
  }

  build(c) {
    const m = this.m;
    const lv = this.e.level(c);
    const r = this.e.result(c);
    const el = s("g", { class: "fx-level" });
    if (c !== ROOT) this.frame(el, c, r);
    const kids = s("g", { class: "fx-kids" });
    const edges = s("g", { class: "fx-edges" });
    const labels = s("g", { class: "fx-edge-labels" });
    const leaves = s("g", { class: "fx-leaves" });
    lv.drawn.forEach((e, j) => {
      const title = e.count > 1 ? `${e.shape} (${e.count} values)` : e.shape;
      edges.append(s("path", { d: edgePath(r.edges[j]), class: "fx-edge", "data-from": e.from, "data-to": e.to, "marker-end": "url(#fx-arrow)" },
        title ? s("title", { text: title }) : null));
      const at = r.labels[j];
      if (at) labels.append(s("text", { x: r1(at[0]), y: r1(at[1] + 4), class: "fx-edge-label", "data-from": e.from, "data-to": e.to, text: e.count > 1 ? `${e.label} +${e.count - 1}` : e.label }));
    });
    lv.items.forEach((key) => {
      const slot = this.e.slot(c, key);
      const open = key[0] === "g" && m.expanded.has(+key.slice(1));
      if (open) {
        const child = this.level(+key.slice(1));
        child.setAttribute("transform", `translate(${r1(slot.x)},${r1(slot.y)})`);
        kids.append(child);
      } else leaves.append(key[0] === "n" ? this.node(+key.slice(1), slot) : this.box(+key.slice(1), slot));
      const st = lv.stubs.get(key);
      if (st) {
        if (st.in.length) leaves.append(this.stub(key, st.in, true, slot, open));
        if (st.out.length) leaves.append(this.stub(key, st.out, false, slot, open));
      }
    });
    el.append(kids, edges, labels, leaves);
    return el;
  }

  /** The frame and title of open box c. */
  frame(el, c, r) {
    const m = this.m;
    const g = m.groups[c];
    const kind = m.kind(c);
    const look = this.look.box(c);
    el.setAttribute("class", ["fx-level", "fx-cluster", `fx-k-${kind}`, g.err ? "fx-has-error" : "", this.selected === "g" + c ? "fx-selected" : "", look && look.none ? "fx-novalue" : ""].join(" ").trim());
    el.setAttribute("data-key", "g" + c);
    el.setAttribute("data-path", g.path);
    el.setAttribute("data-gid", c);
    el.setAttribute("style", `--box:${look ? look.fill : g.c}`);
    el.append(
      s("rect", { x: 0, y: 0, width: r1(r.w), height: r1(r.h), rx: 8, class: "fx-frame" }),
      s("text", { x: 10, y: 16, class: "fx-cluster-label" }, s("tspan", { class: "fx-toggle", text: "−" }), " ", boxTitle(m, c)),
    );
  }

  node(i, p) {
    const n = this.m.node(i);
    const op = n.k === "op";
    const look = this.look.node(i);
    const key = "n" + i;
    const cls = ["fx-node", "fx-leaf", `fx-kind-${n.k}`, n.e ? "fx-error" : "", n.o === "data-dependent" ? "fx-dd" : "", this.selected === key ? "fx-selected" : "", look.none ? "fx-novalue" : ""];
    return s("g", { class: cls.join(" ").trim(), "data-key": key, "data-name": n.n, style: `--c:${look.fill};--t:${look.ink}` },
      s("rect", { x: r1(p.x), y: r1(p.y), width: r1(p.w), height: r1(p.h), rx: op ? 5 : p.h / 2 }),
      s("text", { x: r1(p.x + p.w / 2), y: r1(p.y + p.h / 2 + 4), text: nodeText(n) }),
      s("title", { text: n.t ? `${n.n}: ${n.t}` : n.n }));
  }

  box(c, p) {
    const m = this.m;
    const g = m.groups[c];
    const kind = m.kind(c);
    const key = "g" + c;
    const look = this.look.box(c);
    const deep = m.depth[c] > MAX_DEPTH;
    const cls = ["fx-box", "fx-leaf", `fx-k-${kind}`, g.run ? "fx-run" : "", g.io ? "fx-values" : "", g.err ? "fx-has-error" : "", this.selected === key ? "fx-selected" : "", look && look.none ? "fx-novalue" : ""];
    const el = s("g", { class: cls.join(" ").replace(/\s+/g, " ").trim(), "data-key": key, "data-path": g.path, "data-gid": c, style: `--box:${look ? look.fill : g.c}` });
    if (g.run || g.syn) el.append(s("rect", { x: r1(p.x + 5), y: r1(p.y - 5), width: r1(p.w), height: r1(p.h), rx: 7, class: "fx-stack" }));
    const what = g.io ? ` (${g.n} ${g.io}s)` : g.cls ? ` (${g.cls})` : "";
    el.append(
      s("rect", { x: r1(p.x), y: r1(p.y), width: r1(p.w), height: r1(p.h), rx: g.io ? 14 : 7, class: "fx-box-body" }),
      s("text", { x: r1(p.x + 10), y: r1(p.y + 16), class: "fx-box-label" }, s("tspan", { class: "fx-toggle", text: deep ? "⋯" : "+" }), " ", boxTitle(m, c)),
      s("text", { x: r1(p.x + 10), y: r1(p.y + 31), class: "fx-box-sub", text: boxSubtitle(m, c) }),
      s("title", { text: `${g.path}${what}: ${deep ? "nested too deep to open here" : "double-click to open"}` }),
    );
    return el;
  }

  /** The stubs on one side of an item (see levels.js): a short arrow into its left side ("in",
   * from the far ends named by its label) or out of its right side ("out"), drawn in the room
   * the layout kept for them. Clicking the label goes to the first far end. */
  stub(key, fars, into, p, open) {
    const cy = open ? p.y + 14 : p.y + p.h / 2;
    const x0 = into ? p.x - STUB : p.x + p.w;
    const text = stubText(this.m, into, fars);
    const names = fars.map((f) => visible(this.m.labelOf(f))).join(", ");
    return s("g", { class: "fx-stub", "data-at": key, "data-side": into ? "in" : "out" },
      s("path", { d: `M${r1(x0)},${r1(cy)}L${r1(x0 + STUB)},${r1(cy)}`, class: "fx-edge", "marker-end": "url(#fx-arrow)" }),
      s("text", { x: r1(into ? x0 - 4 : x0 + STUB + 4), y: r1(cy + FONTS.stub / 3), class: "fx-stub-label", "text-anchor": into ? "end" : "start", "data-go": fars[0], text }),
      s("title", { text: `${into ? "from" : "to"} ${names}` }));
  }

  /** Mark `key` as selected (and unmark the previous selection) without redrawing. */
  select(key) {
    for (const el of this.viewport.querySelectorAll(".fx-selected")) el.classList.remove("fx-selected");
    for (const el of this.viewport.querySelectorAll(".fx-linked")) el.classList.remove("fx-linked");
    this.selected = key;
    if (!key) return null;
    const el = this.viewport.querySelector(`[data-key="${key}"]`);
    if (el) el.classList.add("fx-selected");
    for (const e of this.viewport.querySelectorAll(`[data-from="${key}"], [data-to="${key}"]`)) e.classList.add("fx-linked");
    return el;
  }
}

/** The arrow marker, defined once per SVG. */
export function defs() {
  return s("defs", {},
    s("marker", { id: "fx-arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" },
      s("path", { d: "M0,0L10,5L0,10z", class: "fx-arrowhead" })));
}
