// Pan and zoom of one SVG <g> by a transform: drag, wheel (trackpad scroll pans, ctrl/cmd+wheel
// and pinch zoom), keyboard. The graph is never re-laid out for a view change.

const MIN_SCALE = 0.05;
const MAX_SCALE = 4;

export class PanZoom {
  constructor(svg, viewport, onChange = () => {}) {
    this.svg = svg;
    this.viewport = viewport;
    this.onChange = onChange;
    this.x = 0;
    this.y = 0;
    this.k = 1;
    this.dragged = false;
    this.bind();
  }

  apply() {
    this.viewport.setAttribute("transform", `translate(${this.x},${this.y}) scale(${this.k})`);
    this.onChange(this);
  }

  /** Screen point (relative to the SVG) of graph point (gx, gy). */
  toScreen(gx, gy) {
    return [this.x + gx * this.k, this.y + gy * this.k];
  }

  zoomAt(factor, sx, sy) {
    const k = Math.min(MAX_SCALE, Math.max(MIN_SCALE, this.k * factor));
    this.x = sx - ((sx - this.x) * k) / this.k;
    this.y = sy - ((sy - this.y) * k) / this.k;
    this.k = k;
    this.apply();
  }

  zoomCenter(factor) {
    const r = this.svg.getBoundingClientRect();
    this.zoomAt(factor, r.width / 2, r.height / 2);
  }

  panBy(dx, dy) {
    this.x += dx;
    this.y += dy;
    this.apply();
  }

  /** Show the rectangle (graph coordinates) whole, never magnified past 1.25. */
  fit(bx, by, bw, bh, pad = 24) {
    const r = this.svg.getBoundingClientRect();
    const k = Math.min(1.25, (r.width - 2 * pad) / Math.max(bw, 1), (r.height - 2 * pad) / Math.max(bh, 1));
    this.k = Math.max(MIN_SCALE, k);
    this.x = (r.width - bw * this.k) / 2 - bx * this.k;
    this.y = Math.max(pad, (r.height - bh * this.k) / 2) - by * this.k;
    this.apply();
  }

  /** Put graph point (gx, gy) at the centre of the view, at scale at least minK. */
  centerOn(gx, gy, minK = 0.8) {
    const r = this.svg.getBoundingClientRect();
    this.k = Math.max(this.k, minK);
    this.x = r.width / 2 - gx * this.k;
    this.y = r.height / 2 - gy * this.k;
    this.apply();
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
      this.x = start.tx + dx;
      this.y = start.ty + dy;
      this.apply();
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
        if (ev.ctrlKey || ev.metaKey) {
          this.zoomAt(Math.exp((-ev.deltaY * unit) / 300), ev.clientX - r.left, ev.clientY - r.top);
        } else {
          this.panBy(-ev.deltaX * unit, -ev.deltaY * unit);
        }
      },
      { passive: false },
    );
  }
}
