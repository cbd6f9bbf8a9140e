// View-models built by hand in the shape fxviz/render/html.py writes (version 4: nodes as
// columns and a table of what they share, group kinds "k", "overlays", "overlay"), for the unit
// tests. Nodes are written one object each (`node`), as easier to read, and `pack` turns them
// into the columns.
import { Model } from "../src/model.js";

export const group = (p, path, extra = {}) => ({ p, l: path, path, cls: "", call: 0, d: 1, run: 0, params: 0, pl: "", ops: 0, c: "#000", ...extra });
/** A node: name n, kind k (also its family), box g; extra: `i` inputs, `out` metas, `e` error,
 * `t` target, `s` source, `np` parameters, `a` attributes, `o` family, `l` label. */
export const node = (n, k, g, extra = {}) => ({ n, l: n, k, o: k, g, ...extra });

/** `data` with its `nodes` (a list of `node`s) as html.py's _node_columns writes them. */
export function pack(data) {
  const ops = [];
  const index = new Map();
  const cols = { n: [], g: [], f: [], ni: [], i: [], no: [], out: [], s: [], np: [], a: "", al: [], e: {} };
  data.nodes.forEach((r, k) => {
    const entry = [r.k, r.o, r.l, r.t ? (r.t === r.n ? 1 : r.t) : null];
    const key = JSON.stringify(entry);
    if (!index.has(key)) index.set(key, ops.push(entry) - 1);
    cols.n.push(r.n);
    cols.g.push(r.g);
    cols.f.push(index.get(key));
    cols.ni.push((r.i || []).length);
    for (const x of r.i || []) cols.i.push(x);
    cols.no.push((r.out || []).length);
    for (const x of r.out || []) cols.out.push(x);
    cols.s.push(r.s === undefined ? -1 : r.s);
    cols.np.push(r.np || 0);
    const text = r.a ? JSON.stringify(r.a) : "";
    cols.a += text;
    cols.al.push(text.length);
    if (r.e) cols.e[k] = r.e;
  });
  return { kinds: {}, ...data, ops, nodes: cols };
}

/** The Model of a view-model whose nodes are `node`s. */
export const model = (data) => new Model(pack(data));

/** Two top-level modules and a box of model outputs:
 *
 *   x ─► enc [ fc [ w, lin ] ─► relu ] ─► h.0-1 ×2 [ h.0 [ a ] ─► h.1 [ b ] ] ─► out
 *                                          a, b ─► cache [ c0, c1 ]
 */
export function sample() {
  return {
    budget: 60,
    metas: [["[2, 4]", "float32", "2×4 f32"]],
    sources: [],
    groups: [
      group(-1, "enc", { ins: [0], outs: [3] }), // 0
      group(0, "enc.fc", { ins: [0], outs: [2] }), // 1
      group(-1, "h.0-1", { run: 2, ins: [3], outs: [5, 4] }), // 2
      group(2, "h.0", { err: 1 }), // 3
      group(2, "h.1"), // 4
      group(-1, "cache", { io: "output", n: 2, ins: [4, [5, 1]] }), // 5
    ],
    nodes: [
      node("x", "input", -1, { out: [0] }), // 0
      node("w", "parameter", 1, { out: [0], np: 16 }), // 1
      node("lin", "op", 1, { i: [0, 1], out: [0], np: 16 }), // 2
      node("relu", "op", 0, { i: [2, 0], out: [0] }), // 3: reads lin and x again
      node("a", "op", 3, { i: [3], out: [0], e: "RuntimeError: boom" }), // 4
      node("b", "op", 4, { i: [4], out: [0, 0] }), // 5
      node("out", "output", -1, { i: [5] }), // 6
      node("c0", "output", 5, { i: [4] }), // 7
      node("c1", "output", 5, { i: [[5, 1]] }), // 8
    ],
  };
}

/** A chain of `n` ops at the model's level: x -> op0 -> ... -> op(n-1) -> out. */
export function chain(n) {
  const nodes = [node("x", "input", -1, { out: [0] })];
  for (let i = 0; i < n; i++) nodes.push(node(`op${i}`, "op", -1, { i: [i], out: [0] }));
  nodes.push(node("out", "output", -1, { i: [n] }));
  return { budget: 60, metas: [["[1]", "float32", "1 f32"]], sources: [], groups: [], nodes };
}

/** `layers` blocks of `per` ops folded into one run, with a mask read by every block:
 *  x -> emb -> [run: blk.0 .. blk.(layers-1)] -> out, and mask -> every block. */
export function blocks(layers, per = 3) {
  const groups = [group(-1, `blk.0-${layers - 1}`, { run: layers, cls: "Block" })];
  const nodes = [node("x", "input", -1, { out: [0] }), node("mask", "op", -1, { i: [0], out: [0] }), node("emb", "op", -1, { i: [0], out: [0] })];
  let prev = 2;
  for (let b = 0; b < layers; b++) {
    groups.push(group(0, `blk.${b}`, { cls: "Block", ops: per, d: 1 }));
    for (let k = 0; k < per; k++) {
      const inputs = k === 0 ? [prev, 1] : [prev];
      nodes.push(node(`b${b}_${k}`, "op", b + 1, { i: inputs, out: [0] }));
      prev = nodes.length - 1;
    }
  }
  nodes.push(node("out", "output", -1, { i: [prev] }));
  return { budget: 60, metas: [["[1, 4]", "float32", "1×4 f32"]], sources: [], groups, nodes };
}
