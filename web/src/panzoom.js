// Pan and zoom of one SVG <g> by a transform: drag, wheel (trackpad scroll pans, ctrl/cmd+wheel
// and pinch zoom), keyboard. The graph is never re-laid out for a view change. `moved` tells
// whether the user has moved the view since the last fit (a notebook's frame that gets its size
// late refits only if not).
const MIN_SCALE = 0.05;
const MAX_SCALE = 4;
/** Margin kept around a box brought into view, in px. */
export const PAD = 24;

/** The view ({x, y, k}) that shows rectangle r (drawing coordinates) on a vw x vh screen,
 * moved as little as possible from `view`, or null when r already lies whole on screen. When r
 * does not fit at the current zoom, zoom out until it does, but not below `kmin` (the readable
 * zoom; a view already below it keeps its zoom). Where r still does not fit, its top edge goes
 * to the margin (the graph reads top down), and across, `cx` (the drawing's x of what r begins
 * with) goes to the middle, as far as r still fills the screen; without `cx` its left edge goes
 * to the margin. Pure: the unit tests run it. */
export function revealRect(r, view, [vw, vh], kmin, { pad = PAD, cx = null } = {}) {
  const inside = (s, len, v) => s >= -0.5 && s + len <= v + 0.5;
  if (inside(view.x + r.x * view.k, r.w * view.k, vw) && inside(view.y + r.y * view.k, r.h * view.k, vh)) return null;
  const fit = Math.min((vw - 2 * pad) / Math.max(r.w, 1), (vh - 2 * pad) / Math.max(r.h, 1));
  const k = fit >= view.k ? view.k : Math.min(view.k, Math.max(kmin, fit));
  // the top-left corner stays where it was on screen, then each axis moves the least it must
  const axis = (s, len, v, mid = null) => {
    if (inside(s, len, v)) return s;
    if (len <= v - 2 * pad) return Math.min(Math.max(s, pad), v - pad - len);
    return mid === null ? pad : Math.min(pad, Math.max(v - pad - len, v / 2 - mid));
  };
  const sx = axis(view.x + r.x * view.k, r.w * k, vw, cx === null ? null : (cx - r.x) * k);
  const sy = axis(view.y + r.y * view.k, r.h * k, vh);
  return { x: sx - r.x * k, y: sy - r.y * k, k };
}

/** Of rectangles [{ key, x, y, w, h }], the one the point (gx, gy) is looking at: the smallest
 * that holds it, or else the nearest. Null when there are none. */
export function itemAt(rects, gx, gy) {
  let best = null;
  let bestArea = Infinity;
  let near = null;
  let nearDist = Infinity;
  for (const r of rects) {
    const dx = Math.max(r.x - gx, 0, gx - r.x - r.w);
    const dy = Math.max(r.y - gy, 0, gy - r.y - r.h);
    if (!dx && !dy) {
      if (r.w * r.h < bestArea) { best = r; bestArea = r.w * r.h; }
    } else if (dx * dx + dy * dy < nearDist) { near = r; nearDist = dx * dx + dy * dy; }
  }
  return best || near;
}

export class PanZoom {
  constructor(svg, viewport, onChange = () => {}) {
    this.svg = svg;
    this.viewport = viewport;
    this.onChange = onChange;
    this.x = 0;
    this.y = 0;
    this.k = 1;
    this.min = MIN_SCALE;
    this.dragged = false;
    this.moved = false;
    // the view's size, read once per size change: reading it from the page after a drawing
    // change would lay the whole page out there and then again for the next change
    this.measured = null;
    if (typeof ResizeObserver === "function") new ResizeObserver(() => (this.measured = null)).observe(svg);
    else this.measured = undefined;
    this.bind();
  }

  apply(byUser = false) {
    if (byUser) this.moved = true;
    this.viewport.setAttribute("transform", `translate(${this.x},${this.y}) scale(${this.k})`);
    this.onChange(this, byUser);
  }

  size() {
    if (this.measured) return this.measured;
    const r = this.svg.getBoundingClientRect();
    const size = [r.width, r.height];
    // kept until the observer says the size changed (not a size of 0: a frame not laid out yet)
    if (this.measured === null && size[0] && size[1]) this.measured = size;
    return size;
  }

  /** Screen point (relative to the SVG) of graph point (gx, gy). */
  toScreen(gx, gy) {
    return [this.x + gx * this.k, this.y + gy * this.k];
  }

  /** Graph point under screen point (sx, sy). */
  toGraph(sx, sy) {
    return [(sx - this.x) / this.k, (sy - this.y) / this.k];
  }

  set(x, y, k, byUser = false) {
    this.x = x;
    this.y = y;
    this.k = k;
    this.apply(byUser);
  }

  zoomAt(factor, sx, sy, byUser = true) {
    const k = Math.min(MAX_SCALE, Math.max(this.min, this.k * factor));
    this.set(sx - ((sx - this.x) * k) / this.k, sy - ((sy - this.y) * k) / this.k, k, byUser);
  }

  zoomCenter(factor) {
    const [w, h] = this.size();
    this.zoomAt(factor, w / 2, h / 2);
  }

  panBy(dx, dy, byUser = true) {
    this.set(this.x + dx, this.y + dy, this.k, byUser);
  }

  /** The scale at which the rectangle (graph coordinates) fits the view, never above `max`. */
  fitScale(bw, bh, pad = 24, max = 1.25) {
    const [w, h] = this.size();
    return Math.min(max, (w - 2 * pad) / Math.max(bw, 1), (h - 2 * pad) / Math.max(bh, 1));
  }

  /** Show the rectangle whole, however small that makes it (Fit always fits: the zoom floor
   * follows), centred, or from its top when it is taller than the view at scale `k`. */
  fit(bx, by, bw, bh, { pad = 24, k = null } = {}) {
    const [w, h] = this.size();
    const scale = k !== null ? k : Math.max(1e-4, this.fitScale(bw, bh, pad));
    this.min = Math.min(MIN_SCALE, scale);
    this.moved = false;
    this.set((w - bw * scale) / 2 - bx * scale, Math.max(pad, (h - bh * scale) / 2) - by * scale, scale);
  }

  /** Put graph point (gx, gy) at the centre of the view, at scale at least minK. */
  centerOn(gx, gy, minK = 0.8) {
    const [w, h] = this.size();
    const k = Math.max(this.k, minK);
    this.set(w / 2 - gx * k, h / 2 - gy * k, k);
  }

  bind() {
    const svg = this.svg;
    let start = null;
    svg.addEventListener("pointerdown", (ev) => {
      if (ev.button !== 0) return;
      start = { x: ev.clientX, y: ev.clientY, tx: this.x, ty: this.y, id: ev.pointerId };
      this.dragged = false;
    });
    svg.addEventListener("pointermove", (ev) => {
      if (!start || ev.pointerId !== start.id) return;
      const dx = ev.clientX - start.x;
      const dy = ev.clientY - start.y;
      if (!this.dragged && Math.hypot(dx, dy) < 4) return;
      if (!this.dragged) svg.setPointerCapture(ev.pointerId);
      this.dragged = true;
      svg.classList.add("fx-dragging");
      this.set(start.tx + dx, start.ty + dy, this.k, true);
    });
    const end = () => {
      start = null;
      svg.classList.remove("fx-dragging");
    };
    svg.addEventListener("pointerup", end);
    svg.addEventListener("pointercancel", end);
    svg.addEventListener(
      "wheel",
      (ev) => {
        ev.preventDefault();
        const r = svg.getBoundingClientRect();
        // a line-mode wheel (a mouse) reports lines, not pixels
        const unit = ev.deltaMode === 1 ? 16 : ev.deltaMode === 2 ? r.height : 1;
        if (ev.ctrlKey || ev.metaKey) this.zoomAt(Math.exp((-ev.deltaY * unit) / 300), ev.clientX - r.left, ev.clientY - r.top);
        else this.panBy(-ev.deltaX * unit, -ev.deltaY * unit);
      },
      { passive: false },
    );
  }
}
