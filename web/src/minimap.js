// The overview: every drawn item as a small rectangle, the part on screen as a frame. Click or
// drag in it to move there. It lives in the sidebar, so it covers none of the graph.

export class Minimap {
  constructor(canvas, viewer) {
    this.canvas = canvas;
    this.viewer = viewer;
    this.base = null;
    this.scale = 1;
    this.pending = false;
    const move = (ev) => {
      const r = canvas.getBoundingClientRect();
      const gx = (ev.clientX - r.left - this.ox) / this.scale;
      const gy = (ev.clientY - r.top - this.oy) / this.scale;
      const pz = viewer.pz;
      const [w, h] = pz.size();
      pz.set(w / 2 - gx * pz.k, h / 2 - gy * pz.k, pz.k, true);
    };
    let down = false;
    canvas.addEventListener("pointerdown", (ev) => { down = true; canvas.setPointerCapture(ev.pointerId); move(ev); });
    canvas.addEventListener("pointermove", (ev) => { if (down) move(ev); });
    canvas.addEventListener("pointerup", () => { down = false; });
  }

  /** Draw the items again (after a layout), when the page is idle. */
  redraw() {
    if (this.pending) return;
    this.pending = true;
    const run = () => {
      this.pending = false;
      this.paintBase();
      this.view();
    };
    if (typeof requestIdleCallback === "function") requestIdleCallback(run, { timeout: 300 });
    else setTimeout(run, 50);
  }

  paintBase() {
    const c = this.canvas;
    const dpr = window.devicePixelRatio || 1;
    const W = c.clientWidth;
    const H = c.clientHeight;
    if (!W || !H) return;
    c.width = W * dpr;
    c.height = H * dpr;
    const [gw, gh] = this.viewer.engine.size();
    this.scale = Math.min((W - 8) / Math.max(gw, 1), (H - 8) / Math.max(gh, 1));
    this.ox = (W - gw * this.scale) / 2;
    this.oy = (H - gh * this.scale) / 2;
    const base = document.createElement("canvas");
    base.width = c.width;
    base.height = c.height;
    const g = base.getContext("2d");
    g.scale(dpr, dpr);
    const style = getComputedStyle(c);
    const frame = style.getPropertyValue("--mini-frame") || "#c0c6d0";
    const fill = style.getPropertyValue("--mini-fill") || "#8a94a6";
    for (const r of this.viewer.drawnRects()) {
      const x = this.ox + r.x * this.scale;
      const y = this.oy + r.y * this.scale;
      const w = Math.max(1, r.w * this.scale);
      const hh = Math.max(1, r.h * this.scale);
      if (r.open) {
        g.strokeStyle = frame;
        g.strokeRect(x, y, w, hh);
      } else {
        g.fillStyle = fill;
        g.fillRect(x, y, w, hh);
      }
    }
    this.base = base;
  }

  /** Draw the frame of what is on screen. */
  view() {
    const c = this.canvas;
    if (!this.base || !c.width) return;
    const g = c.getContext("2d");
    const dpr = window.devicePixelRatio || 1;
    g.setTransform(1, 0, 0, 1, 0, 0);
    g.clearRect(0, 0, c.width, c.height);
    g.drawImage(this.base, 0, 0);
    g.scale(dpr, dpr);
    const pz = this.viewer.pz;
    const [w, h] = pz.size();
    const [x0, y0] = pz.toGraph(0, 0);
    const [x1, y1] = pz.toGraph(w, h);
    g.strokeStyle = getComputedStyle(c).getPropertyValue("--mini-view") || "#2563eb";
    g.lineWidth = 1.5;
    g.strokeRect(this.ox + x0 * this.scale, this.oy + y0 * this.scale, (x1 - x0) * this.scale, (y1 - y0) * this.scale);
  }
}
