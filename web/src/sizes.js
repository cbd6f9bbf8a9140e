// What each item of the drawing says and how big it is. Text is measured with a canvas in the
// fonts of style.css (no layout pass through the DOM). Status marks are part of the text, so
// that error, data-dependent and output differ in more than colour: ✗ raised, ⚠ data-dependent,
// ▶ input, ◀ output.
import { MAX_DEPTH } from "./model.js";
import { clip, counted, visible } from "./text.js";

const FAMILY = "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif";
/** Font sizes of the graph (px); the smallest decides the first view's zoom (>= 10 px on screen). */
export const FONTS = { node: 12, small: 11, title: 12, sub: 11, edge: 11, stub: 11 };
export const MIN_FONT = Math.min(...Object.values(FONTS));
export const NODE_H = 24;
export const SMALL_H = 20;
export const BOX_H = 38;
export const STUB = 18;

let ctx = null;
const widths = new Map();

/** Width of text in px at `size`, optionally bold or italic (cached: labels repeat). */
export function textWidth(text, size = FONTS.node, style = "") {
  const key = size + style + "|" + text;
  let w = widths.get(key);
  if (w !== undefined) return w;
  if (!ctx) {
    const canvas = typeof OffscreenCanvas !== "undefined" ? new OffscreenCanvas(1, 1) : document.createElement("canvas");
    ctx = canvas.getContext("2d");
  }
  ctx.font = `${style} ${size}px ${FAMILY}`.trim();
  w = ctx.measureText(text).width;
  if (widths.size > 50000) widths.clear();
  widths.set(key, w);
  return w;
}

/** The text a node shows: its label, clipped, after its status mark. */
export function nodeText(n) {
  const mark = n.e ? "✗ " : n.o === "data-dependent" ? "⚠ " : n.k === "input" ? "▶ " : n.k === "output" ? "◀ " : "";
  return mark + visible(clip(n.l));
}

export function isSmall(n) {
  return n.k !== "op";
}

/** The title a box shows: its label, clipped, after ✗ when the failing op is inside. */
export function boxTitle(model, c) {
  const g = model.groups[c];
  return (g.err ? "✗ " : "") + visible(clip(g.l));
}

/** The second line of a closed box: what it holds. */
export function boxSubtitle(model, c) {
  const g = model.groups[c];
  const parts = [];
  if (g.syn) parts.push(visible(clip(g.sub)));
  if (g.io) parts.push(counted(g.n, g.io));
  if (g.run && g.cls) parts.push(visible(clip(g.cls, 32)));
  const kind = model.kind(c);
  if (kind === "plumbing" || kind === "region") parts.push(kind);
  if (g.ops && !g.syn) parts.push(counted(g.ops, "op"));
  if (g.pl) parts.push(`${g.pl} ${g.params === 1 ? "param" : "params"}`);
  if (model.depth[c] > MAX_DEPTH) parts.push(`⋯ ${counted(model.height(c), "level")} deeper`);
  return parts.join(" · ");
}

/** Size of item `key` when drawn closed ("n12" a node, "g3" a closed box). */
export function leafSize(model, key) {
  if (key[0] === "n") {
    const n = model.node(+key.slice(1));
    const small = isSmall(n);
    const w = textWidth(nodeText(n), small ? FONTS.small : FONTS.node, "500");
    return { w: Math.max(w + (small ? 20 : 24), small ? 40 : 56), h: small ? SMALL_H : NODE_H };
  }
  const c = +key.slice(1);
  return {
    w: Math.max(textWidth(boxTitle(model, c), FONTS.title, "600") + 40, textWidth(boxSubtitle(model, c), FONTS.sub) + 24, 90),
    h: BOX_H,
  };
}

/** Width an open box's title bar needs. */
export function titleWidth(model, c) {
  return textWidth(boxTitle(model, c), FONTS.title, "600") + 44;
}

export function edgeLabelSize(label) {
  return label ? [textWidth(label, FONTS.edge) + 8, FONTS.edge + 4] : [0, 0];
}

/** The text of the stubs at one side of an item: "from mask", "to cache +2". */
export function stubText(model, into, fars) {
  const name = visible(clip(model.labelOf(fars[0]), 32));
  return `${into ? "from" : "to"} ${name}${fars.length > 1 ? ` +${fars.length - 1}` : ""}`;
}

/** Room kept beside an item for its stubs' arrows and labels: [left, right]. A stub's label
 * lives inside the item's own space in the layout, so it cannot overlap another item, another
 * stub or an edge's label. */
export function stubRoom(model, stubs) {
  if (!stubs) return [0, 0];
  const room = (into, fars) => (fars.length ? textWidth(stubText(model, into, fars), FONTS.stub, "italic") + STUB + 8 : 0);
  return [room(true, stubs.in), room(false, stubs.out)];
}
