// Hierarchical layout (src/engine.js, src/layout.js with the real dagre): each open box is laid
// out once per state of what is inside it and placed as a block. The properties the report
// promises: a toggle leaves the inside of every other open box where it was relative to that
// box, lays out only the toggled box and the boxes around it (so its cost does not grow with
// how much else is open), and anything draws, however long or deep.
import assert from "node:assert/strict";
import { test } from "node:test";

import { Engine } from "../src/engine.js";
import { layoutBatch } from "../src/layout.js";
import { MAX_DEPTH, ROOT } from "../src/model.js";
import { blocks, chain, group, model, node, sample } from "./fixtures.js";

const measure = {
  leaf: (k) => (k[0] === "g" ? { w: 120, h: 38 } : { w: 60, h: 24 }),
  room: (s) => (s ? [s.in.length ? 50 : 0, s.out.length ? 50 : 0] : [0, 0]),
  title: () => 100,
  edgeLabel: (l) => (l ? [40, 15] : [0, 0]),
};

function engine(data) {
  const m = model(data);
  return [m, new Engine(m, measure, async (jobs) => layoutBatch(jobs))];
}

/** Where every drawn item sits relative to its own box: { "c|key": [x, y, w, h] }. */
function slots(m, e) {
  const out = {};
  for (const c of e.openPostOrder()) for (const key of e.level(c).items) {
    const s = e.slot(c, key);
    out[`${c}|${key}`] = [s.x, s.y, s.w, s.h].map((v) => Math.round(v * 100) / 100);
  }
  return out;
}

test("the model alone lays out, and boxes open as blocks inside it", async () => {
  const [m, e] = engine(sample());
  assert.deepEqual(await e.update(), [ROOT]);
  const [w, h] = e.size();
  assert.ok(w > 0 && h > 0);
  m.expanded.add(2);
  assert.deepEqual(await e.update(), [2, ROOT]);
  const box = e.rect("g2");
  for (const key of e.level(2).items) {
    const r = e.rect(key);
    assert.ok(r.x >= box.x && r.y >= box.y && r.x + r.w <= box.x + box.w && r.y + r.h <= box.y + box.h, `${key} inside g2`);
  }
  // top to bottom: x above enc above the run above the output
  assert.ok(e.rect("n0").y < e.rect("g0").y && e.rect("g0").y < box.y && box.y < e.rect("n6").y);
});

test("several states lay out in one batch, as each would alone, and drawing one lays out nothing more", async () => {
  const states = [new Set(), new Set([0]), new Set([0, 2]), new Set([0, 2, 3])];
  let trips = 0;
  const m = model(sample());
  const e = new Engine(m, measure, async (jobs) => { trips += 1; return layoutBatch(jobs); });
  const sizes = await e.sizes(states);
  assert.equal(trips, 1);
  for (const [k, open] of states.entries()) {
    const [m2, e2] = engine(sample());
    for (const g of open) m2.expanded.add(g);
    await e2.update();
    assert.deepEqual(sizes[k], e2.size(), `state ${k}`);
  }
  for (const g of states[2]) m.expanded.add(g);
  assert.deepEqual((await e.update()).sort(), [ROOT, 0, 2].sort());
  assert.equal(e.last.jobs, 0); // every layout came from the batch
  assert.equal(trips, 1);
});

test("a toggle moves no item inside another open box relative to that box", async () => {
  const [m, e] = engine(blocks(8));
  m.expanded.add(0);
  for (let b = 1; b <= 8; b++) m.expanded.add(b);
  await e.update();
  const before = slots(m, e);
  m.collapse(4);
  const changed = await e.update();
  assert.deepEqual(changed.sort(), [ROOT, 0].sort()); // only the boxes around it were laid out again
  const after = slots(m, e);
  for (const [k, v] of Object.entries(before)) {
    const c = +k.split("|")[0];
    if (c === ROOT || c === 0 || c === 4) continue;
    assert.deepEqual(after[k], v, `${k} moved`);
  }
  // in the boxes around it, the order of items top to bottom is kept
  const order = (s) => Object.entries(s).filter(([k]) => k.startsWith("0|")).sort((a, b) => a[1][1] - b[1][1]).map(([k]) => k);
  assert.deepEqual(order(after), order(before));
  // and opening it again gives back the same drawing, from the cache
  m.expanded.add(4);
  await e.update();
  assert.equal(e.last.jobs, 0);
  assert.deepEqual(slots(m, e), before);
});

test("a toggle lays out the same items whether one or forty blocks are open", async () => {
  const [m, e] = engine(blocks(48, 4));
  m.expanded.add(0);
  const more = +m.items(0)[2].slice(1);
  m.expanded.add(more);
  await e.update();
  const members = m.items(more).map((k) => +k.slice(1));
  const costs = [];
  for (let k = 0; k < members.length; k++) {
    m.expanded.add(members[k]);
    await e.update();
    costs.push(e.last.items);
  }
  // each toggle: the block (4 ops), the ⋯ box (45), the run (4), the model (4)
  assert.equal(new Set(costs.slice(1)).size, 1, `items laid out per toggle: ${costs}`);
  assert.ok(costs[costs.length - 1] < 60);
});

test("a chain of 20,000 ops lays out, and any part of it opens", async () => {
  const [m, e] = engine(chain(20000));
  await e.update();
  assert.ok(e.size()[1] > 0);
  const deep = m.nodeIndex("op12345");
  m.revealNode(deep);
  await e.update();
  const r = e.rect("n" + deep);
  assert.ok(Number.isFinite(r.x) && Number.isFinite(r.y));
  assert.ok(e.total.items < 1000, `laid out ${e.total.items} items`);
});

test("5,000 nested boxes draw MAX_DEPTH deep", async () => {
  const groups = [];
  for (let d = 0; d < 5000; d++) groups.push(group(d - 1, `m${d}`));
  const nodes = [node("x", "input", -1, { out: [0] }), node("deep", "op", 4999, { i: [0], out: [0] }), node("out", "output", -1, { i: [1] })];
  const [m, e] = engine({ groups, nodes, metas: [["[1]", "f32", "1 f32"]], sources: [] });
  m.revealNode(1);
  await e.update();
  assert.equal(e.openPostOrder().length, MAX_DEPTH + 1);
  assert.ok(Number.isFinite(e.rect("g" + MAX_DEPTH).y));
});

test("stubs get room beside their item, so their labels overlap nothing", async () => {
  const [m, e] = engine(blocks(12));
  m.expanded.add(0);
  await e.update();
  const s = e.slot(0, "g12");
  assert.equal(s.slotW, s.w + 50); // the mask's stub on the left
  const lv = e.level(0);
  const r = e.result(0);
  // slots (shape plus room) of different items do not overlap
  const boxes = lv.items.map((k, i) => ({ k, x0: r.x[i] - (e.slot(0, k).slotW) / 2, x1: r.x[i] + e.slot(0, k).slotW / 2, y0: e.slot(0, k).y, y1: e.slot(0, k).y + e.slot(0, k).h }));
  for (const a of boxes) for (const b of boxes) {
    if (a.k >= b.k) continue;
    const apart = a.x1 <= b.x0 || b.x1 <= a.x0 || a.y1 <= b.y0 || b.y1 <= a.y0;
    assert.ok(apart, `${a.k} and ${b.k} overlap`);
  }
});

test("an empty graph lays out as an empty drawing", async () => {
  const [, e] = engine({ groups: [], nodes: [], metas: [], sources: [] });
  await e.update();
  assert.deepEqual(e.size(), [48, 48]);
});
