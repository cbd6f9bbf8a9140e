// The analysis drawer's pure parts: what a row points at and how a column sorts.
import assert from "node:assert/strict";
import { test } from "node:test";

import { cellKey, rowKey, rowKeys, sortRows, sortValue } from "../src/findings.js";

test("a row points at its node, else its box, else nowhere", () => {
  assert.equal(rowKey({ n: 0, g: 3 }), "n0");
  assert.equal(rowKey({ g: 3 }), "g3");
  assert.equal(rowKey({ c: [] }), null);
});

test("a row of the diff page stands for its difference and is about the nodes it names on each side", () => {
  const row = { c: ["only in old"], key: "d0", at: ["a:n3", "a:n4", "b:g2"] };
  assert.equal(rowKey(row), "d0");
  assert.deepEqual(rowKeys(row), ["d0", "a:n3", "a:n4", "b:g2"]);
  // a graph's row: its node or box only; `at` that is not a list of keys is ignored
  assert.deepEqual(rowKeys({ n: 5, c: [] }), ["n5"]);
  assert.deepEqual(rowKeys({ c: [], at: "a:n1" }), []);
  assert.deepEqual(rowKeys({ c: [], at: [null, "b:n2", 3] }), ["b:n2"]);
});

test("a cell of the diff page's row of one side's nodes goes to that side; the others go where the row goes", () => {
  const row = { c: ["only in old", "x", "matmul", "", "h.1.fc", ""], ck: [null, null, "d2:a", "d2:b", null, null], key: "d2" };
  assert.deepEqual(row.c.map((_, j) => cellKey(row, j)), [null, null, "d2:a", null, null, null]);
  // a row without cell targets, or with targets that are not keys, has none
  assert.equal(cellKey({ c: ["a"] }, 0), null);
  assert.equal(cellKey({ c: ["a", "b"], ck: "d0:a" }, 0), null);
  assert.equal(cellKey({ c: ["a", "b"], ck: [3, ""] }, 0), null);
  assert.equal(cellKey({ c: ["a", "b"], ck: [3, ""] }, 1), null);
});

test("a column sorts by Python's numbers, else by the number its text starts with, else as text", () => {
  assert.equal(sortValue({ c: ["3"], k: [3] }, 0), 3);
  assert.equal(sortValue({ c: ["1,234"] }, 0), 1234);
  assert.equal(sortValue({ c: ["0.0774 ✗"] }, 0), 0.0774);
  assert.equal(sortValue({ c: ["15 → 17"] }, 0), 15);
  assert.equal(sortValue({ c: ["exact"] }, 0), "exact");
  const rows = [{ c: ["12"], k: [12] }, { c: ["b"] }, { c: [""] }, { c: ["3"], k: [3] }, { c: ["a"] }, { c: ["1"], k: [1] }];
  assert.deepEqual(sortRows(rows, 0, 1).map((r) => r.c[0]), ["1", "3", "12", "a", "b", ""]);
  assert.deepEqual(sortRows(rows, 0, -1).map((r) => r.c[0]), ["b", "a", "12", "3", "1", ""]);
  // equal keys keep the order Python wrote
  const ties = [{ c: ["x"], id: 1 }, { c: ["x"], id: 2 }];
  assert.deepEqual(sortRows(ties, 0, -1).map((r) => r.id), [1, 2]);
});
