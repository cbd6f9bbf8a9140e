// The report's pure logic (src/model.js), without a DOM: which boxes the first view opens, what
// is visible, how edges merge, ranks and stubs. Run by `node --test web/tests/` (make test and
// make test-fast). The view-models here are hand-built in the shape fxviz/render/html.py writes.
import assert from "node:assert/strict";
import { test } from "node:test";

import { FAN, Model, SPAN, longestPathRanks, markStubs, valueRefs } from "../src/model.js";

/** Two top-level modules and a box of model outputs:
 *
 *   x ─► enc [ fc [ w, lin ] ─► relu ] ─► h.0-1 ×2 [ h.0 [ a ] ─► h.1 [ b ] ] ─► out
 *                                          a, b ─► cache [ c0, c1 ]
 */
function sample() {
  const group = (p, path, extra = {}) => ({ p, l: path, path, cls: "", call: 0, d: 1, run: 0, params: 0, pl: "", ops: 0, c: "#000", ...extra });
  const node = (n, k, g, extra = {}) => ({ n, l: n, k, o: k, c: "#111", g, ...extra });
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
      node("x", "input", -1, { out: [0], u: [2, 3] }), // 0
      node("w", "parameter", 1, { out: [0], u: [2], np: 16 }), // 1
      node("lin", "op", 1, { i: [0, 1], out: [0], u: [3], np: 16 }), // 2
      node("relu", "op", 0, { i: [2, 0], out: [0], u: [4] }), // 3: reads lin and x again
      node("a", "op", 3, { i: [3], out: [0], u: [5, 7], e: "RuntimeError: boom" }), // 4
      node("b", "op", 4, { i: [4], out: [0, 0], u: [6, 8] }), // 5
      node("out", "output", -1, { i: [5] }), // 6
      node("c0", "output", 5, { i: [4] }), // 7
      node("c1", "output", 5, { i: [[5, 1]] }), // 8
    ],
  };
}

test("value references decode to [node, output]", () => {
  assert.deepEqual(valueRefs([3, [5, 1]]), [[3, 0], [5, 1]]);
  assert.deepEqual(valueRefs(undefined), []);
});

test("boxes are indexed: children, roots, chains", () => {
  const m = new Model(sample());
  assert.deepEqual(m.rootGroups, [0, 2, 5]);
  assert.deepEqual(m.rootNodes, [0, 6]);
  assert.deepEqual(m.childGroups[2], [3, 4]);
  assert.deepEqual(m.childNodes[1], [1, 2]);
  assert.deepEqual(m.chain[3], [2, 3]);
  assert.equal(m.within(3, 2), true);
  assert.equal(m.within(1, 2), false);
  assert.equal(m.within(-1, 2), false);
});

test("facts are read from the view-model, not derived", () => {
  const m = new Model(sample());
  assert.deepEqual(m.users(0), [2, 3]);
  assert.deepEqual(m.users(6), []);
  assert.deepEqual(m.boundary(2), { ins: [[3, 0]], outs: [[5, 0], [4, 0]] });
  assert.deepEqual(m.boundary(5), { ins: [[4, 0], [5, 1]], outs: [] });
  assert.deepEqual(m.boundary(4), { ins: [], outs: [] });
  assert.equal(m.hasError(3), true);
  assert.equal(m.hasError(2), false); // Python marks the boxes around a failing op, not the script
  assert.deepEqual(m.inputs(3), [[2, 0], [0, 0]]);
  assert.deepEqual(m.meta(2), ["[2, 4]", "float32", "2×4 f32"]);
  assert.equal(m.meta(6), null);
});

test("hidden nodes are drawn as the outermost collapsed box around them", () => {
  const m = new Model(sample());
  assert.equal(m.hidingGroup(4), 2);
  assert.equal(m.repOfNode(5), "g2");
  assert.equal(m.repOfNode(0), "n0");
  m.expanded.add(2);
  assert.equal(m.hidingGroup(4), 4);
  m.expanded.add(4);
  assert.equal(m.hidingGroup(4), -1);
  assert.equal(m.repOfNode(5), "n5");
});

test("reveal opens every box around a node, once; collapse closes a box and all inside it", () => {
  const m = new Model(sample());
  assert.equal(m.revealNode(5), true);
  assert.deepEqual([...m.expanded].sort(), [2, 4]);
  assert.equal(m.revealNode(5), false);
  assert.equal(m.revealNode(0), false); // a top-level node needs nothing opened
  m.expanded.add(3);
  m.collapse(2);
  assert.deepEqual([...m.expanded], []);
  assert.equal(m.revealGroup(4), true); // shows box 4 itself: opens its parents only
  assert.deepEqual([...m.expanded], [2]);
});

test("the first view opens one or two top-level boxes past the budget, never runs or value boxes", () => {
  const data = sample();
  data.budget = 1;
  const m = new Model(data);
  m.expandToBudget(data.budget);
  // enc opens (only two module boxes at the top), its child fc does not (over budget);
  // the run h.0-1 and the cache box stay folded: they are the summary
  assert.deepEqual([...m.expanded], [0]);
  const m2 = new Model(sample());
  m2.expandToBudget(7);
  assert.deepEqual([...m2.expanded].sort(), [0, 1]);
});

test("with more top-level boxes, the first view opens them breadth-first within the budget", () => {
  const groups = [];
  const nodes = [];
  for (let g = 0; g < 5; g++) {
    groups.push({ p: -1, l: `m${g}`, path: `m${g}`, run: 0 });
    nodes.push({ n: `m${g}.a`, k: "op", g }, { n: `m${g}.b`, k: "op", g });
  }
  const m = new Model({ groups, nodes, metas: [], sources: [] });
  m.expandToBudget(5 + 2); // 5 boxes drawn; each one opened adds one item
  assert.deepEqual([...m.expanded], [0, 1]);
  const all = new Model({ groups, nodes, metas: [], sources: [] });
  all.expandToBudget(100);
  assert.deepEqual([...all.expanded], [0, 1, 2, 3, 4]);
});

test("visible graph: leaves, clusters, and one edge per pair of leaves counting values", () => {
  const m = new Model(sample());
  let v = m.visibleGraph();
  assert.deepEqual(v.leaves, ["g0", "g2", "g5", "n0", "n6"]);
  assert.deepEqual(v.clusters, []);
  const pairs = (view) => view.edges.map((e) => `${e.from}>${e.to}:${e.count}`);
  // x is read twice inside enc (lin and relu): one value, one edge; a and b both go to cache
  assert.deepEqual(pairs(v), ["n0>g0:1", "g0>g2:1", "g2>n6:1", "g2>g5:2"]);
  assert.equal(v.edges[0].label, "2×4 f32");
  m.expanded.add(2);
  v = m.visibleGraph();
  assert.deepEqual(v.clusters, [2]);
  assert.deepEqual(v.leaves, ["g0", "g3", "g4", "g5", "n0", "n6"]);
  assert.deepEqual(pairs(v), ["n0>g0:1", "g0>g3:1", "g3>g4:1", "g4>n6:1", "g3>g5:1", "g4>g5:1"]);
  assert.ok(v.edges.every((e) => !e.stub));
});

test("ranks are longest paths; a cycle is broken at its first leaf", () => {
  const edge = (from, to) => ({ from, to });
  let r = longestPathRanks(["a", "b", "c", "d"], [edge("a", "b"), edge("b", "c"), edge("a", "c"), edge("c", "d")]);
  assert.deepEqual([...r], [["a", 0], ["b", 1], ["c", 2], ["d", 3]]);
  r = longestPathRanks(["a", "b", "c"], [edge("a", "b"), edge("b", "c"), edge("c", "b")]);
  assert.deepEqual([...r], [["a", 0], ["b", 1], ["c", 2]]);
  r = longestPathRanks(["p", "q"], [edge("p", "q"), edge("q", "p")]); // no leaf without inputs
  assert.deepEqual([...r], [["p", 0], ["q", 1]]);
});

/** A chain a1 -> ... -> a8 and a source s with `fan` edges into it, nearest first. */
function fanGraph(fan) {
  const leaves = ["s", "a1", "a2", "a3", "a4", "a5", "a6", "a7", "a8"];
  const edges = [];
  for (let i = 1; i < 8; i++) edges.push({ from: `a${i}`, to: `a${i + 1}` });
  for (const t of ["a1", "a3", "a5", "a6", "a7", "a8"].slice(0, fan)) edges.push({ from: "s", to: t });
  return { leaves, edges };
}

test("a fan's long edges become stubs; its nearest edge and short edges stay real", () => {
  assert.equal(FAN, 6);
  assert.equal(SPAN, 4);
  const { leaves, edges } = fanGraph(6);
  markStubs(leaves, edges);
  const stubs = edges.filter((e) => e.stub).map((e) => `${e.from}>${e.to}:${e.stub}`);
  // spans from s: a1 1, a3 3, a5 5, a6 6, a7 7, a8 8; more than SPAN ranks become stubs
  assert.deepEqual(stubs, ["s>a5:in", "s>a6:in", "s>a7:in", "s>a8:in"]);
});

test("fewer edges than a fan stay edges, however long", () => {
  const { leaves, edges } = fanGraph(5);
  markStubs(leaves, edges);
  assert.deepEqual(edges.filter((e) => e.stub), []);
});

test("many long edges into one leaf become stubs out of their sources", () => {
  // a chain c1 -> ... -> c6 -> t puts t at rank 6; s1..s6 (rank 0) each write into t
  const leaves = ["c1", "c2", "c3", "c4", "c5", "c6", "t", "s1", "s2", "s3", "s4", "s5", "s6"];
  const edges = [];
  for (let k = 1; k < 6; k++) edges.push({ from: `c${k}`, to: `c${k + 1}` });
  edges.push({ from: "c6", to: "t" });
  for (let k = 1; k <= 6; k++) edges.push({ from: `s${k}`, to: "t" });
  markStubs(leaves, edges);
  const stubs = edges.filter((e) => e.stub).map((e) => `${e.from}>${e.to}:${e.stub}`);
  assert.deepEqual(stubs, ["s1>t:out", "s2>t:out", "s3>t:out", "s4>t:out", "s5>t:out", "s6>t:out"]);
});
