// Positions from dagre (a compound graph: expanded module boxes are clusters). Only sizes are
// decided here; what is drawn comes from the model.
import dagre from "@dagrejs/dagre";

const FONT = "12px system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif";
const SMALL_FONT = "10px system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif";
let ctx = null;

/** Width of text in px, measured with a canvas (no layout pass through the DOM). */
export function textWidth(text, small = false, bold = false) {
  if (!ctx) ctx = document.createElement("canvas").getContext("2d");
  ctx.font = (bold ? "600 " : "") + (small ? SMALL_FONT : FONT);
  return ctx.measureText(text).width;
}

export const NODE_H = 26;
export const BOX_H = 40;

/** Lay out `view` (from Model.visibleGraph). `size(key)` gives each leaf's {width, height}.
 * Returns positions of leaves and clusters and the points of each edge. */
export function layout(model, view, size) {
  const g = new dagre.graphlib.Graph({ compound: true, multigraph: false });
  g.setGraph({ rankdir: "TB", nodesep: 18, ranksep: 30, edgesep: 8, marginx: 24, marginy: 24 });
  g.setDefaultEdgeLabel(() => ({}));
  for (const c of view.clusters) g.setNode("g" + c, { cluster: true });
  for (const c of view.clusters) {
    const p = model.groups[c].p;
    if (p >= 0) g.setParent("g" + c, "g" + p);
    // dagre knows nothing of a cluster's title: a flat, edgeless node as wide as the title keeps
    // the box at least that wide (the title itself sits on the box's top border)
    g.setNode("t" + c, { width: textWidth(model.groups[c].l, false, true) + 28, height: 1 });
    g.setParent("t" + c, "g" + c);
  }
  for (const key of view.leaves) {
    g.setNode(key, size(key));
    const parent = key[0] === "n" ? model.nodes[+key.slice(1)].g : model.groups[+key.slice(1)].p;
    if (parent >= 0) g.setParent(key, "g" + parent);
  }
  for (const e of view.edges) {
    if (e.stub) continue; // drawn next to one end, see Model.visibleGraph
    const w = e.label ? textWidth(e.label, true) + 6 : 0;
    g.setEdge(e.from, e.to, { width: w, height: e.label ? 14 : 0, labelpos: "c" });
  }
  dagre.layout(g);
  const pos = new Map();
  for (const key of g.nodes()) {
    const n = g.node(key);
    pos.set(key, { x: n.x, y: n.y, width: n.width, height: n.height });
  }
  const edgePts = view.edges.map((e) => {
    if (e.stub) return null;
    const d = g.edge(e.from, e.to);
    return { points: d.points, x: d.x, y: d.y };
  });
  const gr = g.graph();
  return { pos, edgePts, width: gr.width || 0, height: gr.height || 0 };
}
