// One level of the drawing: the items directly inside one open box (or the model), and the edges
// between them. An edge between two nodes deep inside different boxes is drawn once per level it
// crosses: at the level of the innermost box holding both ends it joins the two items that hold
// them; in each box it leaves it runs from the item holding its source to the box's "out" port
// (its bottom border), in each box it enters from the "in" port (its top border) to the item
// holding its target. So a level's edges depend only on what the box holds, never on which
// boxes inside it are open: a level is laid out once per size of its open items and cached.
// No DOM: web/tests runs it under `node --test`.
import { ROOT } from "./model.js";

export const IN = "in";
export const OUT = "out";

/**
 * The level of box c (ROOT for the model): `{ c, items, edges, stubs }`.
 *
 * `edges`: `{ from, to, label, count, src, dst, stub }`, one per pair of items (or port and
 * item), in graph order of their first target; `count` is how many distinct values it carries, `label` the first
 * one's edge label, `src`/`dst` a node at each end. `stub` ("in"/"out") marks the long edges of a
 * fan (see markStubs): drawn as a short arrow at one end naming the other, `far` being the item
 * that names it (the item holding the far node, at the level where the edge is routed).
 * `stubs`: item key -> { in: [far keys], out: [far keys] }.
 */
export function levelGraph(model, c) {
  // items the drawing leaves out (model.hidden): neither drawn nor an end of an edge
  const hidden = model.hidden && model.hidden.size ? model.hidden : null;
  const items = hidden ? model.items(c).filter((k) => !hidden.has(k)) : model.items(c);
  const off = (i) => hidden !== null && hidden.has("n" + i);
  const edges = new Map();
  // "node i is inside box c", inlined: this runs for every node of a box of 100,000
  const { ng, tin } = model;
  const lo = c === ROOT ? -1 : tin[c];
  const hi = c === ROOT ? Infinity : model.tout[c];
  const inBox = c === ROOT ? () => true : (i) => { const g = ng[i]; if (g < 0) return false; const x = tin[g]; return x >= lo && x <= hi; };
  const add = (from, to, src, k, dst) => {
    const key = from + ">" + to;
    const e = edges.get(key);
    const value = src + ":" + k;
    if (e) e.values.add(value);
    else {
      const m = model.meta(src, k);
      edges.set(key, { from, to, label: m ? m[2] : "", src, dst, values: new Set([value]) });
    }
  };
  const { inOff, inSrc, inOut, uOff, uDst } = model;
  // the hot loop of a box of 100,000 nodes: typed arrays, no allocation per input
  const sub = model.subtreeNodes(c);
  for (let x = 0; x < sub.length; x++) {
    const t = sub[x];
    if (off(t)) continue;
    let it = null;
    for (let j = inOff[t]; j < inOff[t + 1]; j++) {
      const s = inSrc[j];
      const k = inOut[j];
      if (off(s)) continue;
      if (!inBox(s)) add(IN, it || (it = model.itemAt(c, t)), s, k, t);
      else if (ng[s] === ng[t]) {
        // the same box: two items of this level if it is this box, else inside one item
        if (ng[t] === c) add("n" + s, "n" + t, s, k, t);
      } else {
        const is = model.itemAt(c, s);
        if (is !== (it || (it = model.itemAt(c, t)))) add(is, it, s, k, t);
      }
    }
    if (c === ROOT) continue;
    for (let j = uOff[t]; j < uOff[t + 1]; j++) {
      const u = uDst[j];
      if (inBox(u) || off(u)) continue;
      for (let q = inOff[u]; q < inOff[u + 1]; q++) if (inSrc[q] === t) add(it || (it = model.itemAt(c, t)), OUT, t, inOut[q], u);
    }
  }
  // in graph order of their targets: dagre's first guess at the order within a rank follows it
  const list = [...edges.values()].sort((a, b) => a.dst - b.dst || a.src - b.src);
  for (const e of list) {
    e.count = e.values.size;
    delete e.values;
    e.shape = e.label;
    // a port edge repeats what the edge outside the box says, and an op that keeps the shape of
    // its inputs (relu, add) hands on what the edge above it already says: no label, so the
    // drawing stays short enough to read (the shape is in the edge's tooltip and the details)
    if (e.from === IN || e.to === OUT || (e.from[0] === "n" && keepsShape(model, +e.from.slice(1), e.label))) e.label = "";
  }
  const ends = [...(list.some((e) => e.from === IN) ? [IN] : []), ...items, ...(list.some((e) => e.to === OUT) ? [OUT] : [])];
  markStubs(ends, list);
  const stubs = new Map();
  for (const e of list) {
    if (!e.stub) continue;
    const at = e.stub === "in" ? e.to : e.from;
    e.far = farItem(model, c, e);
    const s = stubs.get(at) || { in: [], out: [] };
    const side = s[e.stub];
    if (!side.includes(e.far)) side.push(e.far);
    stubs.set(at, s);
  }
  return { c, items, edges: list, stubs, ports: { in: ends[0] === IN, out: ends[ends.length - 1] === OUT } };
}

/** True when every input of node i that has a label has `label`: i keeps their shape. */
export function keepsShape(model, i, label) {
  let seen = false;
  for (const [s, k] of model.inputs(i)) {
    const m = model.meta(s, k);
    if (!m || !m[2]) continue;
    if (m[2] !== label) return false;
    seen = true;
  }
  return seen;
}

/** The item that names the far end of edge e of level c: the other item, or, for an edge
 * through a port, the item holding the far node in the innermost box that holds both ends. */
function farItem(model, c, e) {
  const into = e.stub === "in";
  const other = into ? e.from : e.to;
  if (other !== IN && other !== OUT) return other;
  const far = into ? e.src : e.dst;
  let anc = model.gp[c];
  while (anc !== ROOT && !model.inside(model.ng[far], anc)) anc = model.gp[anc];
  return model.itemAt(anc, far);
}

/** An end shared by at least FAN other items makes a fan; its edges that skip more than SPAN
 * ranks are drawn as stubs. */
export const FAN = 6;
export const SPAN = 4;

/** Mark the long edges of fans as stubs (`e.stub = "in"`: drawn as a short arrow into its
 * target, naming the source; `"out"`: a short arrow out of its source, naming the target).
 *
 * An attention mask read by each of 48 blocks, or 48 blocks writing one cache box, would thread
 * 48 lines down the whole drawing: the layout grows wide and slow (dagre routes a long edge
 * through a dummy node on every rank it skips), and the lines say nothing an arrow naming the
 * other end does not. The nearest edge of each fan stays a real edge, so the shared end is
 * still placed next to its first reader (or last writer). Ranks are longest paths over the
 * items; a cycle is broken where it is met. */
export function markStubs(items, edges) {
  const rank = longestPathRanks(items, edges);
  const span = (e) => rank.get(e.to) - rank.get(e.from);
  const byEnd = (end) => {
    const m = new Map();
    for (const e of edges) if (!e.stub) (m.get(e[end]) || m.set(e[end], []).get(e[end])).push(e);
    return m;
  };
  for (const fan of byEnd("from").values()) {
    if (fan.length < FAN) continue;
    fan.sort((a, b) => span(a) - span(b));
    for (const e of fan.slice(1)) if (span(e) > SPAN) e.stub = "in";
  }
  for (const fan of byEnd("to").values()) {
    if (fan.length < FAN) continue;
    fan.sort((a, b) => span(a) - span(b));
    for (const e of fan.slice(1)) if (span(e) > SPAN) e.stub = "out";
  }
}

/** Rank of each item: the length of the longest path of edges reaching it (Kahn's order). A
 * cycle (two closed boxes feeding each other) is broken at its first item in drawing order. */
export function longestPathRanks(items, edges) {
  const indeg = new Map(items.map((k) => [k, 0]));
  const out = new Map(items.map((k) => [k, []]));
  for (const e of edges) {
    indeg.set(e.to, indeg.get(e.to) + 1);
    out.get(e.from).push(e.to);
  }
  const rank = new Map(items.map((k) => [k, 0]));
  const queue = items.filter((k) => indeg.get(k) === 0);
  const queued = new Set(queue);
  let next = 0; // items before this index are queued, when a cycle needs breaking
  for (let i = 0; queued.size < items.length || i < queue.length; i++) {
    if (i === queue.length) {
      while (queued.has(items[next])) next++;
      queue.push(items[next]);
      queued.add(items[next]);
    }
    const k = queue[i];
    for (const t of out.get(k)) {
      if (queued.has(t)) continue; // a back edge of a broken cycle
      rank.set(t, Math.max(rank.get(t), rank.get(k) + 1));
      indeg.set(t, indeg.get(t) - 1);
      if (indeg.get(t) === 0) {
        queue.push(t);
        queued.add(t);
      }
    }
  }
  return rank;
}
