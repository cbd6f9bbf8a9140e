// What the diff page pairs across its two sides (src/pairs.js): the diff's node and box pairs,
// and the windowing boxes each side's model adds, paired by parent and place. No DOM.
import assert from "node:assert/strict";
import { test } from "node:test";
import { boxPairs, pairMaps, partnerKey } from "../src/pairs.js";
import { blocks, model } from "./fixtures.js";

test("pair maps go both ways and keep a node's first pair", () => {
  const { ab, ba } = pairMaps([[0, 0], [1, 2], [1, 3], [4, 3]]);
  assert.equal(ab.get(1), 2);
  assert.equal(ba.get(3), 1);
  assert.equal(ba.get(2), 1);
  assert.equal(partnerKey("n1", ab, new Map()), "n2");
  assert.equal(partnerKey("n9", ab, new Map()), null);
  assert.equal(partnerKey("g0", ab, new Map([[0, 5]])), "g5");
});

test("the windowing boxes of two paired runs are paired by place", () => {
  const a = model(blocks(48));
  const b = model(blocks(40));
  const pairs = Array.from({ length: 41 }, (_, i) => [i, i]); // the run and blk.0 .. blk.39
  const { ab, ba } = boxPairs(a, b, pairs);
  const moreA = +a.items(0)[2].slice(1);
  const moreB = +b.items(0)[2].slice(1);
  assert.equal(a.kind(moreA), "more");
  assert.equal(ab.get(moreA), moreB);
  assert.equal(ba.get(moreB), moreA);
  assert.equal(ab.get(5), 5); // the diff's own pairs stay
  // a run without a pair pairs none of its windowing boxes
  const lone = boxPairs(a, b, []);
  assert.equal(lone.ab.size, 0);
});
