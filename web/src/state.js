// The view's state in the URL's hash, so that a link reopens the same view: the selected node or
// box, the open boxes, the overlay and its scale, the search. Boxes are named by what they are
// (kind, module path, call), nodes by their name, so a link survives a report written again for
// the same model. No DOM: web/tests runs it under `node --test`.
import { ROOT } from "./model.js";

/** A name for every box that does not depend on its number: "module:h.0.attn#0",
 * "run:h.0-11#0", "more:run:h.0-47#0/0" (windowing boxes by their place in their parent).
 * `names[j]` is box j's, `byName` the other way. Made a slice at a time (`step`), so that the
 * report can make them while it is idle: 17,000 boxes take 25-50 ms. */
export class BoxNames {
  constructor(model) {
    this.model = model;
    this.names = new Array(model.groups.length);
    this.byName = new Map();
    this.ordinal = new Map();
    this.next = 0;
  }

  /** Name boxes for about `ms` milliseconds (all of them by default); true once all are named. */
  step(ms = Infinity) {
    const m = this.model;
    const end = performance.now() + ms;
    const start = this.next;
    for (; this.next < m.groups.length; this.next++) {
      const j = this.next;
      if (j > start && j % 256 === 0 && performance.now() > end) return false;
      if (j < m.real) {
        const g = m.groups[j];
        this.take(j, `${m.kind(j)}:${g.path}#${g.call || 0}`);
      } else {
        // windowing boxes, parents before children (a parent is made first: a smaller number)
        const p = m.gp[j];
        const k = this.ordinal.get(p) || 0;
        this.ordinal.set(p, k + 1);
        this.take(j, `more:${p === ROOT ? "" : this.names[p]}/${k}`);
      }
    }
    return true;
  }

  take(j, name) {
    let n = name;
    for (let k = 2; this.byName.has(n); k++) n = `${name}~${k}`;
    this.names[j] = n;
    this.byName.set(n, j);
  }
}

/** Every box's name at once (BoxNames): `{ names, byName }`. */
export function boxNames(model) {
  const all = new BoxNames(model);
  all.step();
  return all;
}

/** The hash for a state `{ selected, open, overlay, scale, query }` (`open`: box numbers; only
 * the innermost open boxes are written, their parents are implied). */
export function encodeState(state, model, names) {
  const parts = [];
  const sel = state.selected;
  if (sel) parts.push("sel=" + encodeURIComponent(sel[0] === "n" ? "n:" + model.name(+sel.slice(1)) : "g:" + names.names[+sel.slice(1)]));
  const open = [...state.open].filter((g) => !model.items(g).some((k) => k[0] === "g" && state.open.has(+k.slice(1))));
  if (open.length) parts.push("open=" + open.sort((a, b) => a - b).map((g) => encodeURIComponent(names.names[g])).join(","));
  if (state.overlay) parts.push("ov=" + encodeURIComponent(state.overlay));
  if (state.scale) parts.push("scale=" + encodeURIComponent(state.scale));
  if (state.query) parts.push("q=" + encodeURIComponent(state.query));
  if (state.phase && state.phase !== "both") parts.push("ph=" + encodeURIComponent(state.phase));
  return parts.join("&");
}

/** The state a hash describes; names it does not know are left out. `open` lists every box to
 * open, parents first. */
export function decodeState(hash, model, names) {
  const out = { selected: null, open: [], overlay: null, scale: null, query: "", phase: "both" };
  const text = (hash || "").replace(/^#/, "");
  if (!text) return out;
  for (const part of text.split("&")) {
    const eq = part.indexOf("=");
    if (eq < 0) continue;
    const key = part.slice(0, eq);
    const value = part.slice(eq + 1);
    let v;
    try {
      v = decodeURIComponent(value);
    } catch {
      continue;
    }
    if (key === "sel") {
      if (v.startsWith("n:") && model.nodeIndex(v.slice(2)) >= 0) out.selected = "n" + model.nodeIndex(v.slice(2));
      else if (v.startsWith("g:") && names.byName.has(v.slice(2))) out.selected = "g" + names.byName.get(v.slice(2));
    } else if (key === "open") {
      const seen = new Set();
      for (const item of value.split(",")) {
        let name;
        try {
          name = decodeURIComponent(item);
        } catch {
          continue;
        }
        const g = names.byName.get(name);
        if (g === undefined) continue;
        for (const a of model.ancestors(g).reverse()) {
          if (!seen.has(a)) {
            seen.add(a);
            out.open.push(a);
          }
        }
      }
    } else if (key === "ov") out.overlay = v;
    else if (key === "scale") out.scale = v === "log" || v === "linear" ? v : null;
    else if (key === "q") out.query = v;
    else if (key === "ph") out.phase = v === "forward" || v === "backward" ? v : "both";
  }
  return out;
}
