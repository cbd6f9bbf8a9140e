// Finding one's way: where the view goes when a box opens or everything does (revealRect,
// itemAt), and how search rows tell apart the boxes of repeated layers (boxWhere).
import assert from "node:assert/strict";
import { test } from "node:test";

import { PAD, itemAt, revealRect } from "../src/panzoom.js";
import { Search, boxWhere } from "../src/search.js";
import { group, model, node } from "./fixtures.js";

const VIEW = [1000, 800];

test("a box already whole on screen does not move the view", () => {
  assert.equal(revealRect({ x: 10, y: 10, w: 100, h: 50 }, { x: 0, y: 0, k: 1 }, VIEW, 0.9), null);
});

test("a box that fits at the current zoom moves the least it must, zoom kept", () => {
  // 200 wide at x 900: its right edge is 100 px off screen
  const to = revealRect({ x: 900, y: 100, w: 200, h: 100 }, { x: 0, y: 0, k: 1 }, VIEW, 0.9);
  assert.deepEqual(to, { x: -(200 + PAD - 100), y: 0, k: 1 });
  // above the screen: its top comes to the margin
  const up = revealRect({ x: 100, y: -300, w: 200, h: 100 }, { x: 0, y: 0, k: 1 }, VIEW, 0.9);
  assert.deepEqual(up, { x: 0, y: 300 + PAD, k: 1 });
});

test("a box too big zooms out to fit, never below the readable zoom", () => {
  const view = { x: 0, y: 0, k: 1 };
  // fits at 0.95: zoom there, top-left corner kept on screen
  const a = revealRect({ x: 100, y: 100, w: 400, h: (800 - 2 * PAD) / 0.95 }, view, VIEW, 0.9);
  assert.ok(Math.abs(a.k - 0.95) < 1e-9);
  assert.equal(a.x + 100 * a.k, 100);
  assert.equal(a.y + 100 * a.k, PAD);
  // would need 0.5: stays at the readable 0.9, top at the margin, left where it fits
  const b = revealRect({ x: 100, y: 100, w: 400, h: (800 - 2 * PAD) / 0.5 }, view, VIEW, 0.9);
  assert.equal(b.k, 0.9);
  assert.equal(b.y + 100 * b.k, PAD);
  assert.ok(b.x + 100 * b.k >= PAD && b.x + 500 * b.k <= 1000 - PAD);
  // a view already below the readable zoom keeps its zoom (it is not zoomed in)
  const c = revealRect({ x: 100, y: 100, w: 4000, h: 4000 }, { x: 0, y: 0, k: 0.2 }, VIEW, 0.9);
  assert.equal(c.k, 0.2);
});

test("a box wider than the screen centres what it begins with, still filling the screen", () => {
  const r = { x: 0, y: 0, w: 3000, h: 3000 };
  const to = revealRect(r, { x: 500, y: 500, k: 1 }, VIEW, 1, { cx: 1500 });
  assert.equal(to.x + 1500, 500); // cx in the middle
  assert.equal(to.y, PAD);
  // a first item near the left edge: the box's left edge stops at the margin
  const left = revealRect(r, { x: 500, y: 500, k: 1 }, VIEW, 1, { cx: 50 });
  assert.equal(left.x, PAD);
  const right = revealRect(r, { x: 500, y: 500, k: 1 }, VIEW, 1, { cx: 2990 });
  assert.equal(right.x + 3000, 1000 - PAD);
  // without cx: the left edge at the margin
  assert.equal(revealRect(r, { x: 500, y: 500, k: 1 }, VIEW, 1).x, PAD);
});

test("the item a point looks at: the smallest holding it, else the nearest", () => {
  const rects = [{ key: "g0", x: 0, y: 0, w: 500, h: 500 }, { key: "n1", x: 100, y: 100, w: 50, h: 20 }, { key: "n2", x: 300, y: 300, w: 50, h: 20 }];
  assert.equal(itemAt(rects, 120, 110).key, "n1");
  assert.equal(itemAt(rects, 250, 250).key, "g0");
  assert.equal(itemAt(rects.slice(1), 290, 290).key, "n2");
  assert.equal(itemAt([], 0, 0), null);
});

/** Three blocks, each with an `attn (Attention)` box, and a module called twice. */
function repeated() {
  const groups = [group(-1, "blk.0-2", { l: "blk.0-2 ×3", run: 3, cls: "Block" })];
  const nodes = [node("x", "input", -1, { out: [0] })];
  let prev = 0;
  for (let b = 0; b < 3; b++) {
    const blk = groups.push(group(0, `blk.${b}`, { l: `blk.${b} (Block)`, cls: "Block" })) - 1;
    const attn = groups.push(group(blk, `blk.${b}.attn`, { l: "attn (Attention)", cls: "Attention" })) - 1;
    nodes.push(node(`mm_${b}`, "op", attn, { i: [prev], out: [0] }));
    prev = nodes.length - 1;
  }
  for (const call of [0, 1]) {
    const pool = groups.push(group(-1, "pool", { l: call ? "pool (Pool) #2" : "pool (Pool)", cls: "Pool", call })) - 1;
    nodes.push(node(`pool_${call}`, "op", pool, { i: [prev], out: [0] }));
    prev = nodes.length - 1;
  }
  const plumbing = groups.push(group(1, "blk.0", { l: "2 plumbing ops", k: "plumbing" })) - 1;
  nodes.push(node("detach", "op", plumbing, { i: [prev], out: [0] }));
  nodes.push(node("out", "output", -1, { i: [nodes.length - 1] }));
  return { budget: 60, metas: [["[1]", "float32", "1 f32"]], sources: [], groups, nodes };
}

test("search rows of repeated layers say where each box is", () => {
  const m = model(repeated());
  const hits = new Search(m).find("attn").hits.filter((e) => e.box);
  assert.equal(hits.length, 3);
  assert.deepEqual(hits.map((e) => e.title), ["attn (Attention)", "attn (Attention)", "attn (Attention)"]);
  assert.deepEqual(hits.map((e) => e.sub), ["blk.0.attn", "blk.1.attn", "blk.2.attn"]);
  const pools = new Search(m).find("kind:module pool").hits.filter((e) => e.box);
  assert.deepEqual(pools.map((e) => e.sub), ["pool", "pool #2"]);
  const j = m.groups.findIndex((g) => g.k === "plumbing");
  assert.equal(boxWhere(m, j), "plumbing in blk.0");
  assert.equal(boxWhere(m, 0), "blk.0-2");
});
