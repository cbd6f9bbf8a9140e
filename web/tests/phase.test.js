import { test } from "node:test";
import assert from "node:assert/strict";
import { hasPhases, hiddenKeys } from "../src/phase.js";

// x (input) -> a.fc (op, forward) -> out; backward op in box 1 (a), its grad output; box 2 only backward
function data() {
  return {
    ops: [["input"], ["op"], ["output"], ["parameter"]],
    groups: [{ p: -1 }, { p: 0 }, { p: -1 }],
    nodes: { n: ["x", "fc", "out", "w", "fc_bw", "gw", "bw_only"], f: [0, 1, 2, 3, 1, 2, 1], g: [-1, 1, -1, 1, 1, -1, 2] },
    phases: { backward: [4, 5, 6] },
  };
}

test("the backward's own inputs go with it, the model's stay", () => {
  const d = data();
  d.nodes.f[5] = 0; // gw is now an input of the backward (the loss's gradient)
  assert.ok(hiddenKeys(d, "forward").has("n5"));
  assert.ok(!hiddenKeys(d, "backward").has("n0"));
});

test("both hides nothing, nor does a forward-only graph", () => {
  assert.equal(hiddenKeys(data(), "both").size, 0);
  const d = data();
  delete d.phases;
  assert.equal(hasPhases(d), false);
  assert.equal(hiddenKeys(d, "backward").size, 0);
});

test("backward hides forward ops and outputs, keeps inputs and parameters", () => {
  const h = hiddenKeys(data(), "backward");
  assert.deepEqual([...h].sort(), ["n1", "n2"]);
});

test("forward hides backward ops and the boxes they alone fill", () => {
  const h = hiddenKeys(data(), "forward");
  assert.deepEqual([...h].sort(), ["g2", "n4", "n5", "n6"]);
  // box 1 keeps its forward op and parameter, box 0 its child
  assert.ok(!h.has("g1") && !h.has("g0"));
});

test("a box holding only the hidden pass's ops disappears, its parent too", () => {
  const d = data();
  d.nodes.g = [-1, 1, -1, -1, 1, -1, 2]; // the parameter moved out: box 1 holds fc and fc_bw
  const h = hiddenKeys(d, "backward");
  assert.ok(!h.has("g1"));
  d.phases = { backward: [5, 6] }; // fc_bw now forward: box 1 is all forward
  const h2 = hiddenKeys(d, "backward");
  assert.ok(h2.has("g1") && h2.has("g0") && !h2.has("g2"));
});
