// What the diff page pairs across its two sides: nodes and boxes matched by the diff (Python's
// `pairs` and `groupPairs`), and the windowing boxes each side adds, paired when their parents
// are and they stand at the same place among their siblings. No DOM.
import { ROOT } from "./model.js";

/** Two-way maps of a list of [a, b] pairs: { ab: Map, ba: Map }. */
export function pairMaps(pairs) {
  const ab = new Map();
  const ba = new Map();
  for (const [a, b] of pairs || []) {
    if (!ab.has(a)) ab.set(a, b);
    if (!ba.has(b)) ba.set(b, a);
  }
  return { ab, ba };
}

/** Box pairs (view-model numbering) extended with the windowing boxes of both models. */
export function boxPairs(ma, mb, groupPairs) {
  const { ab, ba } = pairMaps(groupPairs);
  const made = (m) => {
    const byParent = new Map();
    for (let j = m.real; j < m.groups.length; j++) {
      const p = m.gp[j];
      (byParent.get(p) || byParent.set(p, []).get(p)).push(j);
    }
    return byParent;
  };
  const sa = made(ma);
  const sb = made(mb);
  // parents are made before their windowing children, so one pass in order finds every pair
  for (let j = ma.real; j < ma.groups.length; j++) {
    const p = ma.gp[j];
    const q = p === ROOT ? ROOT : ab.get(p);
    if (q === undefined) continue;
    const k = sa.get(p).indexOf(j);
    const other = (sb.get(q) || [])[k];
    if (other !== undefined && !ba.has(other)) {
      ab.set(j, other);
      ba.set(other, j);
    }
  }
  return { ab, ba };
}

/** The key on the other side that stands for `key` ("n12" / "g3") on this side, or null. */
export function partnerKey(key, nodes, boxes) {
  const map = key[0] === "n" ? nodes : boxes;
  const v = map.get(+key.slice(1));
  return v === undefined ? null : key[0] + v;
}
