// Positions from dagre, one level at a time (see levels.js). A job is one box's items with their
// sizes and the edges between them; the result is where each item sits inside the box, the box's
// size, and the points of each edge. Jobs run in a Web Worker (worker.js), so the page never
// freezes; they take plain data and return plain data, and web/tests runs them under node.
import dagre from "@dagrejs/dagre";

/** Space between the box's border and what it holds; the title bar above that. */
export const PAD = 12;
export const TITLE_H = 22;
/** Margin around the model's own level, which has no border or title. */
export const MARGIN = 24;

/**
 * Lay out one level.
 *
 * job: `{ root, title, items: [{ w, h, ai, ao }], edges: [[from, to, lw, lh]], ports: { in, out } }`
 * where `from`/`to` index `items`, -1 is the "in" port and -2 the "out" port, `lw`/`lh` the size
 * of the edge's label (0 for none), `ai`/`ao` where on the item's top and bottom border edges
 * arrive and leave (offset from its centre), and `title` the width the title needs.
 *
 * Returns `{ w, h, x, y, inX, outX, edges }`: the box's size, each item's centre, the ports' x,
 * and each edge's points as a flat array [x0, y0, x1, y1, ...]: from the source's bottom border
 * (the box's top border for the "in" port) to the target's top border (the box's bottom border).
 * Coordinates are relative to the box's top-left corner.
 */
export function layoutLevel(job) {
  const g = new dagre.graphlib.Graph({ multigraph: false });
  g.setGraph({ rankdir: "TB", nodesep: 18, ranksep: 24, edgesep: 8, marginx: 0, marginy: 0 });
  g.setDefaultEdgeLabel(() => ({}));
  const name = (i) => (i === -1 ? "in" : i === -2 ? "out" : String(i));
  // insertion order is dagre's first guess at the order within a rank: the "in" port and the
  // model's inputs first keep the main path on the left, top to bottom
  if (job.ports.in) g.setNode("in", { width: 1, height: 1 });
  job.items.forEach((it, i) => g.setNode(String(i), { width: it.w, height: it.h }));
  if (job.ports.out) g.setNode("out", { width: 1, height: 1 });
  const hasIn = new Uint8Array(job.items.length);
  const hasOut = new Uint8Array(job.items.length);
  for (const [a, b, lw, lh] of job.edges) {
    g.setEdge(name(a), name(b), { width: lw, height: lh, labelpos: "c" });
    if (b >= 0) hasIn[b] = 1;
    if (a >= 0) hasOut[a] = 1;
  }
  // everything hangs below the "in" port and above the "out" port (weight 0: no pull), so the
  // ports are the box's top and bottom and an edge entering the box crosses nothing on its way
  job.items.forEach((_, i) => {
    if (job.ports.in && !hasIn[i]) g.setEdge("in", String(i), { width: 0, height: 0, weight: 0, hidden: true });
    if (job.ports.out && !hasOut[i]) g.setEdge(String(i), "out", { width: 0, height: 0, weight: 0, hidden: true });
  });
  dagre.layout(g);

  const gr = g.graph();
  // dagre gives an empty graph a height of -Infinity
  const finite = (v) => (Number.isFinite(v) ? v : 0);
  const gw = finite(gr.width);
  const gh = finite(gr.height);
  const top = job.root ? MARGIN : TITLE_H + PAD;
  const side = job.root ? MARGIN : PAD;
  const w = Math.max(gw + 2 * side, job.title || 0);
  const h = top + gh + (job.root ? MARGIN : PAD);
  const dx = (w - gw) / 2;
  const x = new Float64Array(job.items.length);
  const y = new Float64Array(job.items.length);
  job.items.forEach((_, i) => {
    const n = g.node(String(i));
    x[i] = n.x + dx;
    y[i] = n.y + top;
  });
  const inX = job.ports.in ? g.node("in").x + dx : w / 2;
  const outX = job.ports.out ? g.node("out").x + dx : w / 2;
  const start = (i) => (i === -1 ? [inX, 0] : [x[i] + job.items[i].ao, y[i] + job.items[i].h / 2]);
  const end = (i) => (i === -2 ? [outX, h] : [x[i] + job.items[i].ai, y[i] - job.items[i].h / 2]);
  const edges = job.edges.map(([a, b]) => {
    const pts = g.edge(name(a), name(b)).points || [];
    // an edge back up the drawing (a weight shared with an earlier module) leaves its source
    // from the top
    const up = a >= 0 && b >= 0 && y[b] < y[a];
    const out = up ? [x[a] + job.items[a].ai, y[a] - job.items[a].h / 2] : [...start(a)];
    for (let k = 1; k < pts.length - 1; k++) out.push(pts[k].x + dx, pts[k].y + top);
    out.push(...end(b));
    return out;
  });
  const labels = job.edges.map(([a, b, lw]) => {
    if (!lw) return null;
    const e = g.edge(name(a), name(b));
    return [e.x + dx, e.y + top];
  });
  return { w, h, x, y, inX, outX, edges, labels };
}

/** Run a batch of jobs in order. An item `{ ref: j, rl, rr }` is the box laid out by job j of
 * the same batch, with room `rl`/`rr` beside it for stubs: its size and ports come from that
 * result. */
export function layoutBatch(jobs) {
  const results = [];
  for (const job of jobs) {
    for (const it of job.items) {
      if (it.ref === undefined) continue;
      const r = results[it.ref];
      const off = (it.rl - it.rr) / 2;
      it.w = r.w + it.rl + it.rr;
      it.h = r.h;
      it.ai = off + r.inX - r.w / 2;
      it.ao = off + r.outX - r.w / 2;
    }
    results.push(layoutLevel(job));
  }
  return results;
}
