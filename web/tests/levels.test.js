// One level of the drawing (src/levels.js): edges lifted to the items of a box, ports, labels,
// ranks and stubs.
import assert from "node:assert/strict";
import { test } from "node:test";

import { FAN, SPAN, keepsShape, levelGraph, longestPathRanks, markStubs } from "../src/levels.js";
import { ROOT } from "../src/model.js";
import { blocks, model, sample } from "./fixtures.js";

const pairs = (lv) => lv.edges.map((e) => `${e.from}>${e.to}:${e.count}`);

test("the model's level: one edge per pair of items, counting values, whatever is open", () => {
  const m = model(sample());
  const lv = levelGraph(m, ROOT);
  assert.deepEqual(lv.items, ["n0", "g0", "g2", "g5", "n6"]);
  // x is read twice inside enc (lin and relu): one value, one edge; a and b both go to cache
  assert.deepEqual(pairs(lv), ["n0>g0:1", "g0>g2:1", "g2>n6:1", "g2>g5:2"]);
  assert.equal(lv.edges[0].label, "2×4 f32");
  assert.deepEqual(lv.ports, { in: false, out: false });
  m.expanded.add(2);
  assert.deepEqual(pairs(levelGraph(m, ROOT)), pairs(lv));
});

test("a box's level: edges from the in port, to the out port", () => {
  const m = model(sample());
  const lv = levelGraph(m, 2);
  assert.deepEqual(lv.items, ["g3", "g4"]);
  assert.deepEqual(new Set(pairs(lv)), new Set(["in>g3:1", "g3>g4:1", "g4>out:2", "g3>out:1"]));
  assert.deepEqual(lv.ports, { in: true, out: true });
  // a port edge carries no label: the edge outside the box says it
  assert.ok(lv.edges.filter((e) => e.from === "in" || e.to === "out").every((e) => e.label === "" && e.shape === "2×4 f32"));
  const enc = levelGraph(m, 0);
  assert.deepEqual(new Set(pairs(enc)), new Set(["in>g1:1", "in>n3:1", "g1>n3:1", "n3>out:1"]));
});

test("an op that keeps its inputs' shape hands on no label", () => {
  const m = model(sample());
  assert.equal(keepsShape(m, 3, "2×4 f32"), true); // relu of lin
  assert.equal(keepsShape(m, 3, "9 f32"), false);
  assert.equal(keepsShape(m, 0, "2×4 f32"), false); // an input has nothing to keep
});

test("a mask read by every block of a run is a stub in each, named after its source", () => {
  const m = model(blocks(12));
  const lv = levelGraph(m, 0);
  const stubbed = lv.edges.filter((e) => e.stub);
  assert.ok(stubbed.length >= 12 - 1 - SPAN);
  assert.ok(stubbed.every((e) => e.from === "in" && e.stub === "in" && e.far === "n1"));
  assert.deepEqual(lv.stubs.get("g12"), { in: ["n1"], out: [] });
  // the nearest reader keeps a real edge, so the mask sits next to it
  assert.equal(lv.edges.find((e) => e.from === "in" && e.to === "g1").stub, undefined);
});

test("ranks are longest paths; a cycle is broken at its first item", () => {
  const edge = (from, to) => ({ from, to });
  let r = longestPathRanks(["a", "b", "c", "d"], [edge("a", "b"), edge("b", "c"), edge("a", "c"), edge("c", "d")]);
  assert.deepEqual([...r], [["a", 0], ["b", 1], ["c", 2], ["d", 3]]);
  r = longestPathRanks(["a", "b", "c"], [edge("a", "b"), edge("b", "c"), edge("c", "b")]);
  assert.deepEqual([...r], [["a", 0], ["b", 1], ["c", 2]]);
  r = longestPathRanks(["p", "q"], [edge("p", "q"), edge("q", "p")]); // no item without inputs
  assert.deepEqual([...r], [["p", 0], ["q", 1]]);
});

/** A chain a1 -> ... -> a8 and a source s with `fan` edges into it, nearest first. */
function fanGraph(fan) {
  const items = ["s", "a1", "a2", "a3", "a4", "a5", "a6", "a7", "a8"];
  const edges = [];
  for (let i = 1; i < 8; i++) edges.push({ from: `a${i}`, to: `a${i + 1}` });
  for (const t of ["a1", "a3", "a5", "a6", "a7", "a8"].slice(0, fan)) edges.push({ from: "s", to: t });
  return { items, edges };
}

test("a fan's long edges become stubs; its nearest edge and short edges stay real", () => {
  assert.equal(FAN, 6);
  assert.equal(SPAN, 4);
  const { items, edges } = fanGraph(6);
  markStubs(items, edges);
  const stubs = edges.filter((e) => e.stub).map((e) => `${e.from}>${e.to}:${e.stub}`);
  assert.deepEqual(stubs, ["s>a5:in", "s>a6:in", "s>a7:in", "s>a8:in"]);
});

test("fewer edges than a fan stay edges, however long", () => {
  const { items, edges } = fanGraph(5);
  markStubs(items, edges);
  assert.deepEqual(edges.filter((e) => e.stub), []);
});

test("many long edges into one item become stubs out of their sources", () => {
  const items = ["c1", "c2", "c3", "c4", "c5", "c6", "t", "s1", "s2", "s3", "s4", "s5", "s6"];
  const edges = [];
  for (let k = 1; k < 6; k++) edges.push({ from: `c${k}`, to: `c${k + 1}` });
  edges.push({ from: "c6", to: "t" });
  for (let k = 1; k <= 6; k++) edges.push({ from: `s${k}`, to: "t" });
  markStubs(items, edges);
  const stubs = edges.filter((e) => e.stub).map((e) => `${e.from}>${e.to}:${e.stub}`);
  assert.deepEqual(stubs, ["s1>t:out", "s2>t:out", "s3>t:out", "s4>t:out", "s5>t:out", "s6>t:out"]);
});
