// The view's state in the URL's hash, so that a link reopens the same view: the selected node or
// box, the open boxes, the overlay and its scale, the search. Boxes are named by what they are
// (kind, module path, call), nodes by their name, so a link survives a report written again for
// the same model. No DOM: web/tests runs it under `node --test`.
import { ROOT } from "./model.js";

/** A name for every box that does not depend on its number: "module:h.0.attn#0",
 * "run:h.0-11#0", "more:run:h.0-47#0/0" (windowing boxes by their place in their parent). */
export function boxNames(model) {
  const names = new Array(model.groups.length);
  const byName = new Map();
  const take = (j, name) => {
    let n = name;
    for (let k = 2; byName.has(n); k++) n = `${name}~${k}`;
    names[j] = n;
    byName.set(n, j);
  };
  for (let j = 0; j < model.real; j++) {
    const g = model.groups[j];
    take(j, `${model.kind(j)}:${g.path}#${g.call || 0}`);
  }
  // windowing boxes, parents before children (a parent is made first, so it has a smaller number)
  const ordinal = new Map();
  for (let j = model.real; j < model.groups.length; j++) {
    const p = model.gp[j];
    const k = ordinal.get(p) || 0;
    ordinal.set(p, k + 1);
    take(j, `more:${p === ROOT ? "" : names[p]}/${k}`);
  }
  return { names, byName };
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
  return parts.join("&");
}

/** The state a hash describes; names it does not know are left out. `open` lists every box to
 * open, parents first. */
export function decodeState(hash, model, names) {
  const out = { selected: null, open: [], overlay: null, scale: null, query: "" };
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
      if (v.startsWith("n:") && model.byName.has(v.slice(2))) out.selected = "n" + model.byName.get(v.slice(2));
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
  }
  return out;
}
