// Windowing: what one box shows when it holds too much to draw. A run of 1,200 folded layers
// opens as its first two members, a "⋯ 1,197 more" box and its last member; a box of 20,000 ops
// in a chain shows its first and last ops around a "⋯ 19,996 more" box, and a box that is still
// too big holds its items in parts of at most LEVEL_MAX, nested as deep as needed. Each level
// then stays small enough for dagre (which recurses, and fails on a chain of ~2,000) and for a
// toggle to cost the same however big the model is. Pure functions; the model applies the plan.

/** Most items one box lays out side by side. */
export const LEVEL_MAX = 120;
/** Items in each part of a windowing box too big to show whole: a part opens in well under the
 * 300 ms a toggle may take at 100,000 nodes (dagre and the browser's paint of 50 blocks). */
export const PART_MAX = 50;
/** A run with more members than this opens windowed. */
export const RUN_WINDOW = 16;
/** Plain nodes kept visible at each end of a windowed stretch. */
export const EDGE = 2;
/** More parameters, buffers or constants than this in one box are gathered into a box of their
 * own (an ATen graph's lifted constants: 2,418 of them at the top of a 1,200-layer model). */
export const STATE_MAX = 8;

/**
 * How to show one box's `items` (keys, in drawing order): null to show them as they are, else a
 * list of keys and placeholders `{ more: [...], role }` that become boxes of their own.
 *
 * `isBox(key)` tells a box from a plain node; `kind` is "run" for a run of folded repeats,
 * "more" for a box this windowing made (its items are only ever cut into parts), or anything
 * else for a module, the model, or any other box. `isState(key)` tells a parameter, buffer or
 * constant read from nowhere: more than STATE_MAX of them are gathered into one box first.
 */
export function windowPlan(items, { isBox, isState = () => false, kind, max = LEVEL_MAX, runWindow = RUN_WINDOW, edge = EDGE }) {
  if (kind !== "more" && kind !== "state") {
    const state = items.filter(isState);
    if (state.length > STATE_MAX) {
      const rest = items.filter((k) => !isState(k));
      const at = items.indexOf(state[0]);
      const before = items.slice(0, at).filter((k) => !isState(k)).length;
      const gathered = [...rest.slice(0, before), { more: state, role: "state" }, ...rest.slice(before)];
      return windowPlan(gathered, { isBox: (k) => typeof k !== "string" || isBox(k), kind, max, runWindow, edge }) || gathered;
    }
  }
  const n = items.length;
  if (kind === "run" && n > runWindow) {
    return [items[0], items[1], { more: items.slice(2, n - 1), role: "more" }, items[n - 1]];
  }
  if (n <= max) return null;
  if (kind === "more" || kind === "state") return parts(items, Math.min(max, PART_MAX));
  // long stretches of plain nodes between boxes keep their ends and fold their middle
  const out = [];
  for (let i = 0; i < n; ) {
    if (isBox(items[i])) {
      out.push(items[i++]);
      continue;
    }
    let j = i;
    while (j < n && !isBox(items[j])) j++;
    if (j - i > 2 * edge + 1) {
      out.push(...items.slice(i, i + edge), { more: items.slice(i + edge, j - edge), role: "more" }, ...items.slice(j - edge, j));
    } else out.push(...items.slice(i, j));
    i = j;
  }
  return out.length <= max ? out : parts(out, max);
}

/** `items` in consecutive parts of equal size, as few as keep each part within `max`. A box of
 * more parts than `max` is cut again when the model windows it in turn. */
export function parts(items, max) {
  const k = Math.ceil(items.length / max);
  const size = Math.ceil(items.length / k);
  const out = [];
  for (let i = 0; i < items.length; i += size) {
    const part = items.slice(i, i + size);
    out.push(part.length === 1 ? part[0] : { more: part, role: "part" });
  }
  return out;
}
