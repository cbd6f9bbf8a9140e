// The pure parts of the report's panels: text made visible and bounded, search, the URL's
// state, overlay colours, settings, and the pairs of the diff page.
import assert from "node:assert/strict";
import { test } from "node:test";

import { ROOT } from "../src/model.js";
import { formatValue, inkFor, painter, position, ramp, range } from "../src/overlay.js";
import { boxPairs, pairMaps, partnerKey } from "../src/pairs.js";
import { Search, parseQuery } from "../src/search.js";
import { sourceLink } from "../src/settings.js";
import { BoxNames, boxNames, decodeState, encodeState } from "../src/state.js";
import { clip, counted, grouped, si, visible } from "../src/text.js";
import { blocks, model, sample } from "./fixtures.js";

test("bidi overrides and control characters are spelled out", () => {
  assert.equal(visible("abc\u202Etxt.exe"), "abc⟨U+202E⟩txt.exe");
  assert.equal(visible("a\u0000b\u001bc"), "a⟨U+0000⟩b⟨U+001B⟩c");
  assert.equal(visible("x\u2067y\u200bz"), "x⟨U+2067⟩y⟨U+200B⟩z");
  assert.equal(visible("plain\ttext"), "plain\ttext");
});

test("a count of one takes the singular", () => {
  assert.deepEqual([0, 1, 2, 1234].map((n) => counted(n, "op")), ["0 ops", "1 op", "2 ops", "1,234 ops"]);
  assert.equal(counted(1, "earlier method"), "1 earlier method");
  assert.equal(counted(3, "child", "children"), "3 children");
});

test("labels are clipped in the middle, numbers carry SI prefixes", () => {
  const long = "a".repeat(100) + "Z";
  const c = clip(long, 20);
  assert.equal(c.length, 20);
  assert.ok(c.includes("…") && c.endsWith("Z"));
  assert.equal(clip("short"), "short");
  assert.equal(si(1.2e9, "FLOP"), "1.2 GFLOP");
  assert.deepEqual([0, 999, 1000, -1234, 124439808, 12345.5].map(grouped), ["0", "999", "1,000", "-1,234", "124,439,808", "12,345.5"]);
  assert.equal(si(512, "B"), "512 B");
  assert.equal(si(0), "0");
});

test("queries: words, filters, regex", () => {
  assert.deepEqual(parseQuery("op:linear module:h.1 attn"), { text: "attn", filters: { op: "linear", module: "h.1" }, regex: false });
  assert.deepEqual(parseQuery("/^ad+$/"), { text: "^ad+$", filters: {}, regex: true });
  assert.equal(parseQuery("x", true).regex, true);
});

test("search counts every match, filters by op, module and kind, groups by module", () => {
  const data = blocks(40);
  const s = new Search(model(data));
  const all = s.find("b");
  assert.ok(all.hits.length > 100); // no silent cap
  const first = s.find("kind:op module:blk.7");
  assert.deepEqual(first.hits.map((h) => h.key).sort(), ["n24", "n25", "n26"]);
  const re = s.find("/^b1_[0-2]$/");
  assert.deepEqual(re.hits.map((h) => h.key), ["n6", "n7", "n8"]);
  assert.equal(s.find("/(/").error.startsWith("not a regular expression"), true);
  const boxes = s.find("kind:run");
  assert.deepEqual(boxes.hits.map((h) => h.key), ["g0"]);
  // results of one module stay together
  const mods = all.hits.filter((h) => !h.box).map((h) => h.module);
  const seen = new Set();
  for (let i = 0; i < mods.length; i++) {
    if (i && mods[i] !== mods[i - 1]) assert.ok(!seen.has(mods[i]), `${mods[i]} split`);
    seen.add(mods[i]);
  }
});

test("the URL's state round-trips, naming boxes by what they are", () => {
  const m = model(blocks(30));
  const names = boxNames(m);
  assert.equal(names.names[0], "run:blk.0-29#0");
  const more = +m.items(0)[2].slice(1);
  assert.equal(names.names[more], "more:run:blk.0-29#0/0");
  m.revealNode(m.nodeIndex("b20_1"));
  const text = encodeState({ selected: "n" + m.nodeIndex("b20_1"), open: m.expanded, overlay: "flops", scale: "log", query: "op:add" }, m, names);
  const back = decodeState("#" + text, m, names);
  assert.deepEqual(new Set(back.open), m.expanded);
  assert.equal(back.selected, "n" + m.nodeIndex("b20_1"));
  assert.deepEqual([back.overlay, back.scale, back.query], ["flops", "log", "op:add"]);
  // a name this report does not know is left out, not an error
  assert.deepEqual(decodeState("#open=module%3Anope%230&sel=n%3Anope", m, names).open, []);
  assert.equal(decodeState("#%E0%A4%A", m, names).selected, null);
});

test("boxes are named a slice at a time as they would be all at once", () => {
  const m = model(blocks(600));
  const all = boxNames(m);
  const sliced = new BoxNames(m);
  let steps = 1;
  while (!sliced.step(0)) steps += 1;
  assert.ok(steps > 2, `${steps} slices`); // 600 blocks and their windowing boxes: more than one slice
  assert.deepEqual(sliced.names, all.names);
  assert.deepEqual([...sliced.byName], [...all.byName]);
  assert.equal(sliced.step(0), true);
});

test("number overlays: linear and log positions, a colour-blind-safe ramp, readable ink", () => {
  assert.equal(position(5, 0, 10, "linear"), 0.5);
  assert.equal(position(100, 1, 10000, "log"), 0.5);
  assert.equal(position(0, 1, 100, "log"), 0);
  assert.equal(ramp(0), "#440154");
  assert.equal(ramp(1), "#fde725");
  assert.equal(inkFor("#fde725"), "#111827");
  assert.equal(inkFor("#440154"), "#ffffff");
  const ov = { name: "flops", kind: "number", unit: "FLOP", scale: "log", nodes: [1, null, 1000], groups: [10] };
  assert.deepEqual(range(ov), [1, 1000]);
  const p = painter(ov);
  assert.equal(p.color(null), null);
  assert.equal(p.color(1000), ramp(1));
  assert.equal(p.legend.scale, "log");
  assert.equal(painter(ov, "linear").legend.scale, "linear");
  assert.equal(formatValue(ov, 2.5e9), "2.5 GFLOP");
  assert.equal(formatValue(ov, null), "—");
});

test("category overlays use their categories' colours, others get a palette colour", () => {
  const ov = { name: "family", kind: "category", categories: { conv: { label: "convolution", color: "#123456" } }, nodes: ["conv", "pool", null] };
  const p = painter(ov);
  assert.equal(p.color("conv"), "#123456");
  assert.ok(/^#[0-9a-f]{6}$/.test(p.color("pool")) && p.color("pool") !== "#123456");
  assert.deepEqual(p.legend.items.map((x) => x[0]), ["convolution", "pool"]);
  assert.equal(formatValue(ov, "conv"), "convolution");
});

test("source links: the pattern filled in, never a script URL", () => {
  assert.equal(sourceLink("vscode://file/{file}:{line}", "/a b/m.py", 12), "vscode://file//a%20b/m.py:12");
  assert.equal(sourceLink("file://{file}", "/x/#y.py", 3), "file:///x/%23y.py");
  assert.equal(sourceLink("", "/x.py", 1), null);
  assert.equal(sourceLink("javascript:alert('{file}')", "/x.py", 1), null);
});

test("diff pairs map both ways, windowing boxes pair by place", () => {
  const a = model(blocks(30));
  const b = model(blocks(30));
  const nodes = pairMaps([[1, 1], [2, 3]]);
  assert.equal(nodes.ba.get(3), 2);
  const boxes = boxPairs(a, b, [[0, 0]]);
  const more = +a.items(0)[2].slice(1);
  assert.equal(boxes.ab.get(more), +b.items(0)[2].slice(1));
  assert.equal(partnerKey("n2", nodes.ab, boxes.ab), "n3");
  assert.equal(partnerKey("g5", nodes.ab, boxes.ab), null);
  assert.equal(partnerKey("g0", nodes.ab, boxes.ab), "g0");
  assert.equal(ROOT, -1);
  assert.ok(model(sample()));
});
