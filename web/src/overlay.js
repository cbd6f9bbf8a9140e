// Overlays: a named analysis result (parameters, FLOPs, bytes, op family, plumbing, diff status,
// a user's own numbers) that colours the graph. Python writes them into the view-model
// (`overlays`: [{name, label, kind, unit, scale, min, max, categories, nodes, groups}], WAVE2.md
// §2); this module turns a value into a colour and says how the legend reads. Without an
// overlay, nodes take their op family's colour from the view-model. No DOM.
import { si } from "./text.js";

/** A sequential ramp that stays ordered for colour-blind readers and in grey (viridis, sampled). */
const RAMP = ["#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c", "#28ae80", "#5ec962", "#addc30", "#fde725"];
/** Okabe-Ito: categories without a colour of their own. */
const CATEGORY = ["#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#f0e442", "#000000"];
export const MISSING = "#b8bec9";

function hex(c) {
  const v = c.replace("#", "");
  const full = v.length === 3 ? v.split("").map((x) => x + x).join("") : v;
  return [0, 2, 4].map((i) => parseInt(full.slice(i, i + 2), 16));
}

/** Black or white, whichever reads better on `fill` (WCAG relative luminance). */
export function inkFor(fill) {
  if (!/^#[0-9a-f]{3,6}$/i.test(fill || "")) return "#ffffff";
  const lum = hex(fill).map((c) => {
    const s = c / 255;
    return s <= 0.03928 ? s / 12.92 : ((s + 0.055) / 1.055) ** 2.4;
  });
  const L = 0.2126 * lum[0] + 0.7152 * lum[1] + 0.0722 * lum[2];
  return L > 0.33 ? "#111827" : "#ffffff";
}

/** The colour at t in [0, 1] of the ramp. */
export function ramp(t) {
  const x = Math.min(1, Math.max(0, t)) * (RAMP.length - 1);
  const i = Math.min(RAMP.length - 2, Math.floor(x));
  const f = x - i;
  const a = hex(RAMP[i]);
  const b = hex(RAMP[i + 1]);
  return "#" + a.map((v, k) => Math.round(v + (b[k] - v) * f).toString(16).padStart(2, "0")).join("");
}

/** The range of a number overlay: its declared min/max, else those of its values. */
export function range(ov) {
  let lo = ov.min;
  let hi = ov.max;
  if (lo === undefined || lo === null || hi === undefined || hi === null) {
    lo = Infinity;
    hi = -Infinity;
    for (const list of [ov.nodes || [], ov.groups || []]) {
      for (const v of list) {
        if (typeof v !== "number" || !Number.isFinite(v)) continue;
        if (v < lo) lo = v;
        if (v > hi) hi = v;
      }
    }
    if (lo > hi) return [0, 0];
  }
  return [lo, hi];
}

/** t in [0, 1] of value v on a linear or log scale over [lo, hi]. A log scale starts at the
 * smallest positive value: zero and negatives sit at its bottom. */
export function position(v, lo, hi, scale) {
  if (hi <= lo) return 0.5;
  if (scale === "log") {
    const a = Math.log10(Math.max(lo, Number.MIN_VALUE));
    const b = Math.log10(hi);
    if (v <= 0 || b <= a) return 0;
    return (Math.log10(v) - a) / (b - a);
  }
  return (v - lo) / (hi - lo);
}

/** The smallest positive value of an overlay: where its log scale starts. */
function positiveMin(ov) {
  let best = Infinity;
  for (const list of [ov.nodes || [], ov.groups || []]) for (const v of list) if (typeof v === "number" && v > 0 && v < best) best = v;
  return best === Infinity ? 1 : best;
}

/**
 * A painter for overlay `ov` (null: the op-family colours) with `scale` ("linear" | "log";
 * default the overlay's own): `color(value)` -> fill or null when the value is missing, and
 * `legend` -> `{kind, label, unit, scale, lo, hi, stops}` or `{kind, label, items: [[label,
 * colour]]}`.
 */
export function painter(ov, scale) {
  if (!ov) return null;
  if (ov.kind === "category") {
    const cats = ov.categories || {};
    const names = Object.keys(cats);
    const seen = new Set(names);
    for (const list of [ov.nodes || [], ov.groups || []]) for (const v of list) if (v !== null && v !== undefined && !seen.has(String(v))) { seen.add(String(v)); names.push(String(v)); }
    const colour = new Map(names.map((n, i) => [n, (cats[n] && cats[n].color) || CATEGORY[i % CATEGORY.length]]));
    return {
      color: (v) => (v === null || v === undefined ? null : colour.get(String(v)) || MISSING),
      legend: { kind: "category", label: ov.label || ov.name, items: names.map((n) => [(cats[n] && cats[n].label) || n, colour.get(n)]) },
    };
  }
  const sc = scale || ov.scale || "linear";
  let [lo, hi] = range(ov);
  if (sc === "log") lo = Math.max(lo, positiveMin(ov));
  return {
    color: (v) => (typeof v === "number" && Number.isFinite(v) ? ramp(position(v, lo, hi, sc)) : null),
    legend: { kind: "number", label: ov.label || ov.name, unit: ov.unit || "", scale: sc, lo, hi, stops: RAMP },
  };
}

/** An overlay's value for the details panel: "1.2 GFLOP", "conv", or "—". */
export function formatValue(ov, v) {
  if (v === null || v === undefined) return "—";
  if (ov.kind === "category") {
    const c = (ov.categories || {})[String(v)];
    return c && c.label ? c.label : String(v);
  }
  return typeof v === "number" ? si(v, ov.unit || "") : String(v);
}
