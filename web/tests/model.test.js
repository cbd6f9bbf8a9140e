// The report's model (src/model.js, src/window.js) without a DOM: how boxes are indexed and
// ordered, which boxes windowing adds, what the first view opens, reveal and collapse. Run by
// `node --test web/tests/` (make test and make test-fast).
import assert from "node:assert/strict";
import { test } from "node:test";

import { MAX_DEPTH, Model, ROOT, groupKind, valueRefs } from "../src/model.js";
import { mergeLater } from "../src/nodes.js";
import { LEVEL_MAX, RUN_WINDOW, parts, windowPlan } from "../src/window.js";
import { blocks, chain, group, model, node, pack, sample } from "./fixtures.js";

test("value references decode to [node, output]", () => {
  assert.deepEqual(valueRefs([3, [5, 1]]), [[3, 0], [5, 1]]);
  assert.deepEqual(valueRefs(undefined), []);
});

test("a box's kind: the view-model's k, else run, values or module", () => {
  assert.equal(groupKind({ k: "plumbing" }), "plumbing");
  assert.equal(groupKind({ run: 3 }), "run");
  assert.equal(groupKind({ io: "output" }), "values");
  assert.equal(groupKind({}), "module");
});

test("boxes are indexed: items in drawing order, parents, depths, subtrees", () => {
  const m = model(sample());
  // inputs first, boxes where their first op is, outputs last
  assert.deepEqual(m.items(ROOT), ["n0", "g0", "g2", "g5", "n6"]);
  assert.deepEqual(m.items(0), ["g1", "n3"]);
  assert.deepEqual(m.items(1), ["n1", "n2"]);
  assert.deepEqual(m.items(2), ["g3", "g4"]);
  assert.equal(m.depth[3], 2);
  assert.equal(m.inside(3, 2), true);
  assert.equal(m.inside(1, 2), false);
  assert.equal(m.inside(ROOT, 2), false);
  assert.equal(m.inside(4, ROOT), true);
  assert.deepEqual([...m.subtreeNodes(0)].sort(), [1, 2, 3]);
  assert.deepEqual([...m.subtreeNodes(ROOT)].sort((a, b) => a - b), [0, 1, 2, 3, 4, 5, 6, 7, 8]);
  assert.equal(m.itemAt(ROOT, 2), "g0");
  assert.equal(m.itemAt(0, 2), "g1");
  assert.equal(m.itemAt(1, 2), "n2");
  assert.deepEqual(m.ancestors(3), [3, 2]);
});

test("facts are read from the view-model, not derived", () => {
  const m = model(sample());
  assert.deepEqual(m.users(0), [2, 3]);
  assert.deepEqual(m.boundary(2), { ins: [[3, 0]], outs: [[5, 0], [4, 0]] });
  assert.equal(m.hasError(3), true);
  assert.equal(m.hasError(2), false); // Python marks the boxes around a failing op, not the script
  assert.deepEqual(m.inputs(3), [[2, 0], [0, 0]]);
  assert.deepEqual(m.meta(2), ["[2, 4]", "float32", "2×4 f32"]);
  assert.equal(m.meta(6), null);
});

test("hidden nodes are drawn as the outermost closed box around them", () => {
  const m = model(sample());
  assert.equal(m.hidingGroup(4), 2);
  assert.equal(m.repOfNode(5), "g2");
  assert.equal(m.repOfNode(0), "n0");
  m.expanded.add(2);
  assert.equal(m.hidingGroup(4), 4);
  assert.equal(m.repOf("g4"), "g4");
  m.expanded.add(4);
  assert.equal(m.hidingGroup(4), -1);
  assert.equal(m.repOfNode(5), "n5");
});

test("reveal opens every box around a node, once; collapse closes a box and all inside it", () => {
  const m = model(sample());
  assert.equal(m.revealNode(5), true);
  assert.deepEqual([...m.expanded].sort(), [2, 4]);
  assert.equal(m.revealNode(5), false);
  assert.equal(m.revealNode(0), false); // a top-level node needs nothing opened
  m.expanded.add(3);
  m.collapse(2);
  assert.deepEqual([...m.expanded], []);
  assert.equal(m.revealGroup(4), true); // shows box 4 itself: opens its parents only
  assert.deepEqual([...m.expanded], [2]);
  assert.equal(m.toggle(2), true);
  assert.deepEqual([...m.expanded], []);
});

test("the first view opens boxes of boxes breadth-first, never runs, values, plumbing or leaf modules", () => {
  const data = sample();
  data.groups.push(group(0, "enc.mask", { k: "plumbing" }));
  data.nodes.push(node("arange", "op", 6, { out: [0] }));
  const m = model(data);
  // enc holds a box (fc): it opens; fc holds ops only and stays closed, as do the run h.0-1,
  // the cache box and the plumbing box
  assert.deepEqual(m.firstViewSteps(60), [[0]]);
  assert.equal(m.opensFirst(6), false);
});

test("with many top-level boxes, the first view opens breadth-first within the budget", () => {
  const groups = [];
  const nodes = [];
  for (let g = 0; g < 5; g++) groups.push(group(-1, `m${g}`), group(2 * g, `m${g}.inner`));
  for (let g = 0; g < 10; g++) nodes.push(node(`op${g}a`, "op", g), node(`op${g}b`, "op", g));
  // reorder so that parents come first, as view.py writes them
  const m = model({ groups: groups.map((x, i) => ({ ...x, p: i % 2 ? i - 1 : -1 })), nodes, metas: [], sources: [] });
  assert.equal(m.items(ROOT).length, 5);
  // each box holds a box and two ops: opening one adds two items
  assert.deepEqual(m.firstViewSteps(5 + 2 * 2), [[0, 2]]);
  assert.deepEqual(m.firstViewSteps(100), [[0, 2, 4, 6, 8]]); // the inner boxes hold ops only
});

test("a run of more than RUN_WINDOW members opens as first two, ⋯ more, last", () => {
  const m = model(blocks(48));
  const items = m.items(0);
  assert.equal(items.length, 4);
  assert.deepEqual([items[0], items[1], items[3]], ["g1", "g2", "g48"]);
  const more = +items[2].slice(1);
  assert.equal(m.kind(more), "more");
  assert.equal(m.groups[more].l, "⋯ 45 more");
  assert.equal(m.groups[more].sub, "blk.2 … blk.46");
  assert.equal(m.items(more).length, 45);
  assert.equal(m.gp[5], more); // a member's parent is now the windowing box
  assert.equal(m.inside(5, 0), true);
  // a member inside it is revealed through it
  m.revealNode(m.nodeIndex("b30_0"));
  assert.deepEqual([...m.expanded].sort((a, b) => a - b), [0, 31, more]);
  const small = model(blocks(RUN_WINDOW));
  assert.equal(small.items(0).length, RUN_WINDOW);
});

test("20,000 ops in one chain: no level holds more than LEVEL_MAX items, every op is reachable", () => {
  const m = model(chain(20000));
  const top = m.items(ROOT);
  // x and the first op, ⋯ 19,999 more, the last op and the output
  assert.deepEqual([top[0], top[1], top[3], top[4]], ["n0", "n1", "n20000", "n20001"]);
  assert.equal(m.groups[+top[2].slice(1)].l, "⋯ 19,998 more");
  for (let c = ROOT; c < m.groups.length; c++) assert.ok(m.items(c).length <= LEVEL_MAX, `box ${c} holds ${m.items(c).length}`);
  const deep = m.nodeIndex("op10000");
  assert.equal(m.revealNode(deep), true);
  assert.equal(m.repOfNode(deep), "n" + deep);
  assert.ok(m.depth[m.ng[deep]] <= 4);
});

test("window plans: runs, stretches of plain nodes, parts", () => {
  const keys = (n, p = "n") => Array.from({ length: n }, (_, i) => p + i);
  const isBox = (k) => k[0] === "g";
  assert.equal(windowPlan(keys(10), { isBox, kind: "module" }), null);
  const run = windowPlan(keys(20, "g"), { isBox, kind: "run" });
  assert.deepEqual([run[0], run[1], run[3]], ["g0", "g1", "g19"]);
  assert.equal(run[2].more.length, 17);
  const mixed = [...keys(200), "g0", ...keys(3, "x")];
  const plan = windowPlan(mixed, { isBox, kind: "module", max: 120 });
  assert.deepEqual(plan.slice(0, 2), ["n0", "n1"]);
  assert.equal(plan[2].more.length, 196);
  assert.deepEqual(plan.slice(3), ["n198", "n199", "g0", "x0", "x1", "x2"]);
  const cut = parts(keys(250), 120);
  assert.deepEqual(cut.map((p) => p.more.length), [84, 84, 82]);
});

test("nesting 5,000 deep: indexed without recursion, opened only MAX_DEPTH deep", () => {
  const groups = [];
  for (let d = 0; d < 5000; d++) groups.push(group(d - 1, `m${d}`, { d: d + 1 }));
  const nodes = [node("x", "input", -1, { out: [0] }), node("deep", "op", 4999, { i: [0], out: [0] }), node("out", "output", -1, { i: [1] })];
  const m = model({ groups, nodes, metas: [], sources: [] });
  assert.equal(m.depth[4999], 5000);
  assert.equal(m.itemAt(ROOT, 1), "g0");
  m.revealNode(1);
  assert.equal(m.expanded.size, MAX_DEPTH);
  assert.equal(m.repOfNode(1), "g" + MAX_DEPTH);
  assert.equal(m.canExpand(MAX_DEPTH), false);
  assert.equal(m.height(MAX_DEPTH), 5000 - MAX_DEPTH - 1);
});

test("many constants read from nowhere are gathered into one box", () => {
  const nodes = [node("x", "input", -1, { out: [0] })];
  for (let i = 0; i < 30; i++) nodes.push(node(`c${i}`, "constant", -1, { out: [0] }));
  nodes.push(node("add", "op", -1, { i: [0, 1, 2], out: [0] }), node("out", "output", -1, { i: [31] }));
  const m = model({ groups: [], nodes, metas: [], sources: [] });
  const top = m.items(ROOT);
  assert.equal(top.length, 4); // x, the box of 30 constants, add, out
  const box = +top.find((k) => k[0] === "g").slice(1);
  assert.equal(m.groups[box].l, "30 constants");
  assert.equal(m.items(box).length, 30);
  assert.equal(m.opensFirst(box), false);
});

test("a node's colour is its family's, from the view-model's table", () => {
  const data = sample();
  data.kinds = { op: "#123456" };
  const m = model(data);
  assert.equal(m.color(2), "#123456");
  assert.equal(m.color(0), "#607d8b"); // no colour for inputs in this table
});

test("node columns: readers are the inputs read the other way, each reader once, in graph order", () => {
  const m = model(sample());
  assert.deepEqual(m.users(0), [2, 3]); // x: lin, then relu (which reads it again)
  assert.deepEqual(m.users(2), [3]);
  assert.deepEqual(m.users(4), [5, 7]);
  assert.deepEqual(m.users(5), [6, 8]); // b's first output to out, its second to c1
  assert.deepEqual(m.users(6), []);
  assert.deepEqual(m.inputs(8), [[5, 1]]);
  const twice = model({ groups: [], metas: [], sources: [], nodes: [node("x", "input", -1), node("add", "op", -1, { i: [0, 0, 0] }), node("mul", "op", -1, { i: [1, 0] })] });
  assert.deepEqual(twice.users(0), [1, 2]);
  assert.deepEqual([...twice.uOff], [0, 2, 3, 3]);
});

test("node columns: what nodes share comes from the ops table, the rest per node", () => {
  const data = sample();
  data.nodes[1] = node("enc.fc.weight", "parameter", 1, { out: [0], np: 16, l: "weight", t: "enc.fc.weight" });
  data.nodes[2] = { ...data.nodes[2], t: "aten.linear.default", s: 0, a: { bias: true } };
  data.sources = [["m.py", 3, "forward", "y = self.fc(x)"]];
  const packed = pack(data);
  assert.deepEqual(packed.ops[packed.nodes.f[1]], ["parameter", "parameter", "weight", 1]); // the target is its name
  const m = new Model(packed);
  assert.equal(m.count, 9);
  assert.deepEqual(m.node(1), { n: "enc.fc.weight", l: "weight", k: "parameter", o: "parameter", t: "enc.fc.weight", e: undefined });
  assert.deepEqual([m.target(2), m.target(3)], ["aten.linear.default", ""]);
  assert.deepEqual([m.params(2), m.params(3)], [16, 0]);
  assert.deepEqual([m.source(2), m.source(3)], [["m.py", 3, "forward", "y = self.fc(x)"], null]);
  assert.deepEqual([m.attrs(2), m.attrs(3)], [{ bias: true }, {}]);
  assert.deepEqual([m.outputCount(5), m.meta(5, 1), m.meta(6)], [2, ["[2, 4]", "float32", "2×4 f32"], null]);
  assert.equal(m.error(4), "RuntimeError: boom");
  assert.deepEqual(m.errorNodes(), [4]);
  assert.deepEqual([m.nodeIndex("relu"), m.nodeIndex("nope")], [3, -1]);
});

test("the page's second block merges into the first; what the first has stays", () => {
  const data = pack(sample());
  delete data.nodes.a;
  delete data.nodes.al;
  delete data.groups[0].ins;
  data.overlays = [{ name: "flops", kind: "number" }, { name: "mine", kind: "number", nodes: [1], groups: [2] }];
  const m = new Model(data);
  const attrs = { a: '{"bias":true}', al: data.nodes.n.map((n) => (n === "lin" ? 13 : 0)) };
  const boundaries = data.groups.map((g, j) => (j === 0 ? [[0], [3]] : [[9], []]));
  mergeLater(data, { nodes: attrs, boundaries, overlays: { flops: { nodes: [5], groups: [6] }, mine: { nodes: [7], groups: [8] } } });
  assert.deepEqual(m.attrs(2), { bias: true });
  assert.deepEqual(m.boundary(0), { ins: [[0, 0]], outs: [[3, 0]] });
  assert.deepEqual(m.boundary(1).ins, [[0, 0]]); // the first block's own
  assert.deepEqual(m.boundary(3).outs, []);
  assert.deepEqual(data.overlays.map((o) => [o.nodes, o.groups]), [[[5], [6]], [[1], [2]]]);
});
