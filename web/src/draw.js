// SVG drawing of a laid-out view: module boxes (expanded clusters and collapsed boxes), nodes,
// edges with their shape labels. Every element carries data-* attributes naming what it shows,
// which the click handlers and the browser tests read.
import { s } from "./dom.js";
import { BOX_H, NODE_H, textWidth } from "./layout.js";

/** Size of the leaf `key` ("n12" a node, "g3" a collapsed box). */
export function leafSize(model, key) {
  if (key[0] === "n") {
    const n = model.nodes[+key.slice(1)];
    const small = n.k !== "op";
    return { width: Math.max(textWidth(n.l, small) + (small ? 18 : 24), small ? 40 : 56), height: small ? 22 : NODE_H };
  }
  const g = model.groups[+key.slice(1)];
  return { width: Math.max(textWidth(g.l, false, true) + 40, textWidth(boxSubtitle(g), true) + 24, 90), height: BOX_H };
}

export function boxSubtitle(g) {
  const parts = [];
  if (g.io) parts.push(`${g.n} ${g.io}s`);
  if (g.run && g.cls) parts.push(g.cls);
  if (g.ops) parts.push(`${g.ops} ops`);
  if (g.pl) parts.push(`${g.pl} params`);
  return parts.join(" · ");
}

/** Smooth path through dagre's points: straight segments joined by quadratic corners. */
function edgePath(pts) {
  if (pts.length < 3) return `M${pts[0].x},${pts[0].y}L${pts[pts.length - 1].x},${pts[pts.length - 1].y}`;
  let d = `M${pts[0].x},${pts[0].y}`;
  for (let i = 1; i < pts.length - 1; i++) {
    const mx = (pts[i].x + pts[i + 1].x) / 2;
    const my = (pts[i].y + pts[i + 1].y) / 2;
    d += i === pts.length - 2 ? `Q${pts[i].x},${pts[i].y} ${pts[i + 1].x},${pts[i + 1].y}` : `Q${pts[i].x},${pts[i].y} ${mx},${my}`;
  }
  return d;
}

/** Replace the contents of `root` with the drawing of `view` at positions `lay`. */
export function draw(root, model, view, lay, selected) {
  const clusters = s("g", { class: "fx-clusters" });
  const edges = s("g", { class: "fx-edges" });
  const labels = s("g", { class: "fx-edge-labels" });
  const leaves = s("g", { class: "fx-leaves" });

  // outer clusters first so inner ones paint above them
  const order = view.clusters.slice().sort((a, b) => model.chain[a].length - model.chain[b].length);
  for (const c of order) {
    const g = model.groups[c];
    const p = lay.pos.get("g" + c);
    const x = p.x - p.width / 2;
    const y = p.y - p.height / 2;
    const cls = ["fx-cluster", g.run ? "fx-run" : "", g.io ? "fx-values" : "", model.hasError(c) ? "fx-has-error" : "", selected === "g" + c ? "fx-selected" : ""];
    clusters.append(
      s("g", { class: cls.join(" "), "data-key": "g" + c, "data-path": g.path, "data-gid": c },
        s("rect", { x, y, width: p.width, height: p.height, rx: 8, style: `--box:${g.c}` }),
        s("text", { x: x + 10, y: y + 4, class: "fx-cluster-label" },
          s("tspan", { class: "fx-toggle", text: "−" }), " ", g.l),
      ),
    );
  }

  const stubsAt = new Map();
  view.edges.forEach((e, j) => {
    if (e.stub) {
      const at = e.stub === "in" ? e.to : e.from;
      const k = stubsAt.get(at) || 0;
      stubsAt.set(at, k + 1);
      edges.append(stub(model, e, lay.pos.get(at), k));
      return;
    }
    const pts = lay.edgePts[j];
    const title = e.count > 1 ? `${e.label} (${e.count} values)` : e.label;
    edges.append(
      s("path", { d: edgePath(pts.points), class: "fx-edge", "data-from": e.from, "data-to": e.to, "marker-end": "url(#fx-arrow)" },
        s("title", { text: title })),
    );
    if (e.label) {
      labels.append(s("text", { x: pts.x, y: pts.y + 3, class: "fx-edge-label", "data-from": e.from, "data-to": e.to, text: e.count > 1 ? `${e.label} +${e.count - 1}` : e.label }));
    }
  });

  for (const key of view.leaves) {
    const p = lay.pos.get(key);
    const x = p.x - p.width / 2;
    const y = p.y - p.height / 2;
    if (key[0] === "n") {
      const i = +key.slice(1);
      const n = model.nodes[i];
      const op = n.k === "op";
      const cls = ["fx-node", `fx-kind-${n.k}`, n.e ? "fx-error" : "", selected === key ? "fx-selected" : ""];
      leaves.append(
        s("g", { class: cls.join(" "), "data-key": key, "data-name": n.n, style: `--c:${n.c}` },
          s("rect", { x, y, width: p.width, height: p.height, rx: op ? 5 : p.height / 2 }),
          s("text", { x: p.x, y: p.y + 4, text: n.l }),
          s("title", { text: n.t ? `${n.n}: ${n.t}` : n.n }),
        ),
      );
    } else {
      const c = +key.slice(1);
      const g = model.groups[c];
      const cls = ["fx-box", g.run ? "fx-run" : "", g.io ? "fx-values" : "", model.hasError(c) ? "fx-has-error" : "", selected === key ? "fx-selected" : ""];
      const box = s("g", { class: cls.join(" "), "data-key": key, "data-path": g.path, "data-gid": c, style: `--box:${g.c}` });
      if (g.run) box.append(s("rect", { x: x + 6, y: y - 6, width: p.width, height: p.height, rx: 7, class: "fx-stack" }));
      box.append(
        s("rect", { x, y, width: p.width, height: p.height, rx: g.io ? 14 : 7, class: "fx-box-body" }),
        s("text", { x: x + 10, y: y + 16, class: "fx-box-label" }, s("tspan", { class: "fx-toggle", text: "+" }), " ", g.l),
        s("text", { x: x + 10, y: y + 31, class: "fx-box-sub", text: boxSubtitle(g) }),
        s("title", { text: `${g.path}${g.cls ? ` (${g.cls})` : ""}${g.io ? ` (${g.n} ${g.io}s)` : ""}: double-click to expand` }),
      );
      leaves.append(box);
    }
  }

  root.replaceChildren(clusters, edges, labels, leaves);
}

const STUB = 16;

/** Name of what leaf `key` shows: a node's label or a box's. */
function leafName(model, key) {
  return key[0] === "n" ? model.nodes[+key.slice(1)].l : model.groups[+key.slice(1)].l;
}

/** A stub edge (see Model.visibleGraph): a short arrow into the top of its target ("in") or out
 * of the bottom of its source ("out"), labelled with the other end; `k` counts the stubs already
 * drawn at this leaf, so that they stand side by side. Clicking the label jumps to the other end. */
function stub(model, e, p, k) {
  const into = e.stub === "in";
  const other = into ? e.from : e.to;
  const x = into ? p.x - p.width / 2 + 12 + 14 * k : p.x + p.width / 2 - 12 - 14 * k;
  const y0 = into ? p.y - p.height / 2 - STUB : p.y + p.height / 2;
  const name = leafName(model, other);
  const title = `${into ? "from" : "to"} ${name}: ${e.label}${e.count > 1 ? ` (${e.count} values)` : ""}`;
  return s("g", { class: "fx-stub", "data-from": e.from, "data-to": e.to },
    s("path", { d: `M${x},${y0}L${x},${y0 + STUB}`, class: "fx-edge", "data-from": e.from, "data-to": e.to, "marker-end": "url(#fx-arrow)" }),
    s("text", { x: into ? x - 4 : x + 4, y: into ? y0 + 6 : y0 + STUB, class: "fx-stub-label", "text-anchor": into ? "end" : "start", "data-go": other, text: `${into ? "from" : "to"} ${name}` }),
    s("title", { text: title }));
}

/** The arrow marker, defined once per SVG. */
export function defs() {
  return s("defs", {},
    s("marker", { id: "fx-arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" },
      s("path", { d: "M0,0L10,5L0,10z", class: "fx-arrowhead" })));
}
