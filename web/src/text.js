// Text the script writes on the page: names from a model are data, and some data is built to
// deceive. A bidirectional override (U+202E) would show "txt.exe" as "exe.txt"; a control
// character would be invisible. Every string the report writes goes through `visible`, which
// spells such characters out: "⟨U+202E⟩". Labels drawn in the graph are also bounded in length
// (`clip`); the details panel shows the full text. No DOM: web/tests runs this under node.

// bidi embeddings, overrides and isolates, marks, C0/C1 controls (tab and newline kept), and
// the zero-width characters that make two different names look equal
const HIDDEN = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]/g;

/** `text` with every invisible or direction-changing character written as ⟨U+XXXX⟩. */
export function visible(text) {
  const s = String(text);
  return s.replace(HIDDEN, (c) => `⟨U+${c.charCodeAt(0).toString(16).toUpperCase().padStart(4, "0")}⟩`);
}

/** Longest label drawn in the graph, in characters. */
export const LABEL_MAX = 64;

/** `text` shortened to `max` characters with an ellipsis in the middle, so that both the start
 * (a module's name) and the end (its class) stay readable. */
export function clip(text, max = LABEL_MAX) {
  const s = String(text);
  if (s.length <= max) return s;
  const head = Math.ceil((max - 1) * 0.6);
  return s.slice(0, head) + "…" + s.slice(s.length - (max - 1 - head));
}

/** Thousands separators: 124439808 -> "124,439,808". Integers without toLocaleString, which
 * is slow enough to matter when every windowing box of a 100,000-node model names its count. */
export function grouped(n) {
  const v = Number(n);
  if (Number.isSafeInteger(v)) return String(v).replace(/\B(?=(\d{3})+$)/g, ",");
  return v.toLocaleString("en-US");
}

/** A count and its noun, singular for one: (1, "op") -> "1 op", (1234, "op") -> "1,234 ops". */
export function counted(n, noun, plural = noun + "s") {
  return `${grouped(n)} ${Number(n) === 1 ? noun : plural}`;
}

const PREFIXES = [[1e15, "P"], [1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];

/** A number with an SI prefix and its unit: (1.2e9, "FLOP") -> "1.2 GFLOP"; (512, "B") -> "512 B". */
export function si(value, unit = "") {
  if (value === null || value === undefined || Number.isNaN(value)) return "—";
  const v = Number(value);
  const a = Math.abs(v);
  for (const [div, p] of PREFIXES) {
    if (a >= div) return `${trim(v / div)} ${p}${unit}`.trim();
  }
  return `${trim(v)} ${unit}`.trim();
}

function trim(x) {
  const a = Math.abs(x);
  if (a === 0) return "0";
  if (Number.isInteger(x) && a < 1000) return String(x);
  if (a < 0.01) return x.toExponential(1);
  return String(Number(x.toPrecision(3)));
}
