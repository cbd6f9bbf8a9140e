// One graph on screen: its model, layout engine, drawing and pan/zoom, and what the user does to
// it (open, close, select, go to, fit). The report has one viewer; the diff page two, kept in
// step by diffview.js. Layout is asynchronous (a worker): every change goes through one queue,
// and `root.dataset.busy` is set while one is under way (the browser tests wait on it).
import { Engine } from "./engine.js";
import { Scene, defs } from "./draw.js";
import { ROOT } from "./model.js";
import { PanZoom, itemAt, revealRect } from "./panzoom.js";
import { MIN_FONT, edgeLabelSize, leafSize, stubRoom, titleWidth } from "./sizes.js";

/** Smallest size a label may have on screen in the first view, in px. */
export const MIN_LABEL_PX = 10;
/** Expand-all stops opening boxes once this many items are drawn (and says so). */
export const EXPAND_ALL_MAX = 20000;

/** Mark the page busy (`root.dataset.busy`, which the browser tests wait on) until `promise`
 * settles; counted on the page's root, which the diff page's two viewers share. Returns a
 * promise that settles with it. */
export function busyUntil(root, promise) {
  root.fxBusy = (root.fxBusy || 0) + 1;
  root.dataset.busy = "true";
  const done = () => {
    root.fxBusy -= 1;
    if (!root.fxBusy) delete root.dataset.busy;
  };
  return promise.finally(done);
}

/** Run fn(deadline) when the page is idle (`deadline.timeRemaining()`: for how long). */
export function idle(fn) {
  if (typeof requestIdleCallback === "function") requestIdleCallback(fn);
  else setTimeout(() => fn({ timeRemaining: () => 8 }), 50);
}

/** Flash `el` (the .fx-flash animation), again if it is flashing: taking the class off and
 * putting it back in one frame would not restart it, and making the page lay itself out
 * between the two costs a whole layout of the page in the middle of a change. */
function flash(el) {
  if (!el.classList.contains("fx-flash")) {
    el.classList.add("fx-flash");
    return;
  }
  el.classList.remove("fx-flash");
  afterPaint(() => el.classList.add("fx-flash"));
}

/** Run fn once the frame with the current DOM has been painted (the frame after the next). */
export function afterPaint(fn) {
  requestAnimationFrame(() => requestAnimationFrame(fn));
}

export class Viewer {
  constructor({ root, svg, viewport, model, look, run, onSelect = () => {}, onView = () => {}, onToggle = () => {}, onDraw = () => {}, onError = () => {} }) {
    this.root = root;
    this.svg = svg;
    this.model = model;
    this.onSelect = onSelect;
    this.onToggle = onToggle;
    this.onError = onError;
    this.onDraw = onDraw;
    const measure = { leaf: (k) => leafSize(model, k), room: (st) => stubRoom(model, st), title: (c) => titleWidth(model, c), edgeLabel: edgeLabelSize };
    this.engine = new Engine(model, measure, run);
    this.scene = new Scene(viewport, model, this.engine, look);
    this.pz = new PanZoom(svg, viewport, (pz, byUser) => onView(this, byUser));
    svg.prepend(defs());
    this.selected = null;
    this.queue = Promise.resolve();
    this.layouts = 0;
    this.fitted = false;
  }

  /** Run `fn` after every change queued before it; the page says it is busy meanwhile. */
  schedule(fn) {
    const p = this.queue.then(fn);
    this.queue = busyUntil(this.root, p).catch((err) => this.onError(err));
    return p;
  }

  /** Lay out and draw what is open now. */
  async refresh() {
    performance.mark("fxviz:layout-start");
    await this.engine.update();
    performance.mark("fxviz:layout-end");
    this.scene.draw();
    if (this.selected) this.scene.select(this.selected);
    performance.mark("fxviz:draw-end");
    performance.measure("fxviz:layout", "fxviz:layout-start", "fxviz:layout-end");
    performance.measure("fxviz:draw", "fxviz:layout-end", "fxviz:draw-end");
    this.layouts += 1;
    this.root.dataset.layouts = String(this.layouts);
    this.onDraw(this);
  }

  /** Screen position of the top-left corner of item `key`, or null when it is not drawn. */
  screenOf(key) {
    if (!this.drawn(key)) return null;
    const r = this.engine.rect(key);
    return this.pz.toScreen(r.x, r.y);
  }

  /** True when item `key` is drawn (itself, not a box hiding it). */
  drawn(key) {
    const m = this.model;
    const c = m.parentOf(key);
    return m.hidingGroup(c) < 0 && this.engine.result(c) !== undefined && this.engine.level(c).index.has(key);
  }

  /** Keep item `key` where it was on screen (`at`), after a change moved it in the drawing. */
  keep(key, at) {
    if (!at || !this.drawn(key)) return;
    const r = this.engine.rect(key);
    this.pz.set(at[0] - r.x * this.pz.k, at[1] - r.y * this.pz.k, this.pz.k);
  }

  /** Bring item `key` whole into view if it is not (revealRect: the least pan; with `zoom`,
   * zooming out no further than the readable zoom; where it still does not fit, its top and
   * what it begins with on screen). */
  reveal(key, { zoom = false } = {}) {
    if (!this.drawn(key)) return;
    const size = this.pz.size();
    const kmin = zoom ? this.minReadable() : this.pz.k;
    const to = revealRect(this.engine.rect(key), this.pz, size, kmin, { cx: this.firstX(key, size[0]) });
    if (to) this.pz.set(to.x, to.y, to.k);
  }

  /** The drawing's x of what open box `key` begins with, for a box wider than the screen: its
   * first item, or that item's own first item while it is an open box wider than the screen. */
  firstX(key, vw) {
    const m = this.model;
    const wide = (r) => r.w * this.minReadable() > vw;
    let r = this.engine.rect(key);
    for (let k = key; k[0] === "g" && m.expanded.has(+k.slice(1)) && wide(r);) {
      const first = m.items(+k.slice(1))[0];
      if (!first || !this.drawn(first)) break;
      k = first;
      r = this.engine.rect(k);
    }
    return r.x + r.w / 2;
  }

  /** True when screen point `at` lies in the view. */
  onScreen([sx, sy]) {
    const [vw, vh] = this.pz.size();
    return sx >= 0 && sy >= 0 && sx < vw && sy < vh;
  }

  /** Open or close box c, keeping its top-left corner where it is on screen, unless the box
   * would then reach past the screen's edge (opened, it may be far bigger than it was): then
   * the view pans, never zooms, just enough to bring it in (its top, at least). A box toggled
   * while its corner is off screen (from the keyboard, or a script) leaves the view alone. */
  toggle(c, { select = true, quiet = false } = {}) {
    return this.schedule(async () => {
      if (!quiet) performance.mark("fxviz:expand-start");
      const key = "g" + c;
      const at = this.screenOf(key);
      if (!this.model.toggle(c)) return;
      await this.refresh();
      this.keep(key, at);
      if (at && this.onScreen(at)) this.reveal(key);
      this.onToggle(this, c, this.model.expanded.has(c));
      if (select) this.select(key, false);
      if (!quiet) {
        await new Promise((resolve) => afterPaint(resolve));
        performance.mark("fxviz:expand-end");
        performance.measure("fxviz:expand", "fxviz:expand-start", "fxviz:expand-end");
      }
    });
  }

  /** Open a set of boxes (and the boxes around them) and close others, then draw: for state
   * from a link or from the other side of a diff. */
  setOpen(open, close = []) {
    return this.schedule(async () => {
      for (const g of close) this.model.collapse(g);
      for (const g of open) this.model.open(this.model.ancestors(g).reverse());
      await this.refresh();
    });
  }

  /** Show a node or box in the details panel and mark it; centre on it if asked. */
  select(key, center = true) {
    this.selected = key;
    const el = this.scene.select(key);
    if (key && center && this.drawn(key)) {
      const r = this.engine.rect(key);
      this.pz.centerOn(r.x + r.w / 2, r.y + Math.min(r.h / 2, 200));
      if (el) flash(el);
    }
    this.onSelect(this, key);
  }

  /** Leave out the items `keys` (a Set of "n12", "g3") and draw again, keeping the view on what
   * the reader was looking at. */
  setHidden(keys) {
    return this.schedule(async () => {
      const focus = this.focus();
      this.model.hidden = keys;
      this.engine.reset();
      await this.refresh();
      this.refocus(focus);
    });
  }

  /** Reveal a node ("n12") or box ("g3"), opening what hides it, then select it; an item the
   * drawing leaves out (setHidden) brings everything back (`onUnhide`). */
  go(key, { center = true, mark = true } = {}) {
    return this.schedule(async () => {
      if (mark) performance.mark("fxviz:go-start");
      const m = this.model;
      let changed = key[0] === "n" ? m.revealNode(+key.slice(1)) : m.revealGroup(+key.slice(1));
      if (m.hidden.has(key)) {
        m.hidden = new Set();
        this.engine.reset();
        if (this.onUnhide) this.onUnhide();
        changed = true;
      }
      if (changed) await this.refresh();
      // a box nested too deep to open stands for what is inside it in the drawing; the details
      // are still those of what was asked for
      if (this.drawn(key)) this.select(key, center);
      else {
        this.select(m.repOf(key), center);
        this.onSelect(this, key);
      }
      if (mark) {
        await new Promise((resolve) => afterPaint(resolve));
        performance.mark("fxviz:go-end");
        performance.measure("fxviz:go", "fxviz:go-start", "fxviz:go-end");
      }
    });
  }

  fit() {
    const [w, h] = this.engine.size();
    this.pz.fit(0, 0, w, h);
  }

  /** The smallest zoom at which every label is at least MIN_LABEL_PX on screen. */
  minReadable() {
    return MIN_LABEL_PX / MIN_FONT + 0.005;
  }

  /** The first view: open the model's structure breadth-first (runs, plumbing and value boxes
   * stay closed) as far as it fits the screen with every label readable, then show it whole; if
   * even the top level does not fit, show its top at the smallest readable zoom. */
  firstView(budget, extraOpen = []) {
    return this.schedule(async () => {
      const m = this.model;
      // lay out every candidate (nothing opened, then each step more) in one batch, then draw the
      // biggest that fits: one trip to the worker and one drawing, however many steps
      const steps = m.firstViewSteps(budget);
      const states = [new Set(m.expanded)];
      for (const step of steps) states.push(new Set([...states[states.length - 1], ...step]));
      const sizes = await this.engine.sizes(states);
      let s = states.length - 1;
      while (s > 0 && this.pz.fitScale(...sizes[s]) < this.minReadable()) s -= 1;
      for (const g of states[s]) m.expanded.add(g);
      if (extraOpen.length) for (const g of extraOpen) m.open(m.ancestors(g).reverse());
      await this.refresh();
      this.readableFit();
    });
  }

  /** Fit, but never below the readable zoom: then the top of the drawing, centred on the
   * model's first item. */
  readableFit() {
    const [w, h] = this.engine.size();
    const [vw, vh] = this.pz.size();
    if (!vw || !vh) return;
    this.fitted = true;
    const k = this.pz.fitScale(w, h);
    if (k >= this.minReadable()) {
      this.pz.fit(0, 0, w, h);
      return;
    }
    const kk = this.minReadable();
    const first = this.model.items(ROOT)[0];
    const r = first ? this.engine.rect(first) : { x: 0, w: 0 };
    this.pz.fit(0, 0, w, h, { k: kk });
    this.pz.set(Math.min(24, vw / 2 - (r.x + r.w / 2) * kk), 12, kk);
    this.pz.moved = false;
  }

  /** What the reader is looking at, for a change that redraws everything: the selection when
   * it is on screen, else the closed item nearest the centre of the view; with where its
   * top-left corner is on screen. Null when nothing is drawn. */
  focus() {
    const [vw, vh] = this.pz.size();
    const key = this.selected && this.drawn(this.selected) ? this.selected : null;
    if (key) {
      const r = this.engine.rect(key);
      const [sx, sy] = this.pz.toScreen(r.x, r.y);
      if (sx < vw && sy < vh && sx + r.w * this.pz.k > 0 && sy + r.h * this.pz.k > 0) return { key, at: [sx, sy] };
    }
    const near = itemAt(this.drawnRects().filter((r) => !r.open), ...this.pz.toGraph(vw / 2, vh / 2));
    return near ? { key: near.key, at: this.pz.toScreen(near.x, near.y) } : null;
  }

  /** After a change that redrew everything: `focus` where it was on screen, at a readable zoom
   * at least, and whole in view as far as that zoom allows. */
  refocus(focus) {
    if (!focus || !this.drawn(focus.key)) {
      this.readableFit();
      return;
    }
    const r = this.engine.rect(focus.key);
    const k = Math.max(this.pz.k, this.minReadable());
    this.pz.set(focus.at[0] - r.x * k, focus.at[1] - r.y * k, k);
    this.reveal(focus.key, { zoom: true });
  }

  /** Open every box breadth-first until EXPAND_ALL_MAX items are drawn, keeping the view on
   * what the reader was looking at, at a readable zoom (the overview shows the rest, Fit the
   * whole). Resolves to how many boxes are left closed (0 when everything is open). */
  expandAll(limit = EXPAND_ALL_MAX) {
    return this.schedule(async () => {
      performance.mark("fxviz:expand-all-start");
      const m = this.model;
      const focus = this.focus();
      let count = m.items(ROOT).length;
      let frontier = m.items(ROOT).filter((k) => k[0] === "g").map((k) => +k.slice(1));
      let left = 0;
      while (frontier.length) {
        const next = [];
        for (const g of frontier) {
          const items = m.items(g);
          if (!m.canExpand(g) || count + items.length > limit) {
            if (!m.expanded.has(g)) left += 1;
            continue;
          }
          m.expanded.add(g);
          count += items.length - 1;
          for (const k of items) if (k[0] === "g") next.push(+k.slice(1));
        }
        frontier = next;
      }
      await this.refresh();
      this.refocus(focus);
      await new Promise((resolve) => afterPaint(resolve));
      performance.mark("fxviz:expand-all-end");
      performance.measure("fxviz:expand-all", "fxviz:expand-all-start", "fxviz:expand-all-end");
      return left;
    });
  }

  collapseAll() {
    return this.schedule(async () => {
      this.model.expanded.clear();
      await this.refresh();
      this.fit();
    });
  }

  /** Every drawn item's rectangle in drawing coordinates, for the overview:
   * [{ key, x, y, w, h, open }]. */
  drawnRects() {
    const m = this.model;
    const e = this.engine;
    const out = [];
    const stack = [[ROOT, 0, 0]];
    while (stack.length) {
      const [c, ox, oy] = stack.pop();
      if (!e.result(c)) continue;
      for (const key of e.level(c).items) {
        const s = e.slot(c, key);
        const open = key[0] === "g" && m.expanded.has(+key.slice(1));
        out.push({ key, x: ox + s.x, y: oy + s.y, w: s.w, h: s.h, open });
        if (open) stack.push([+key.slice(1), ox + s.x, oy + s.y]);
      }
    }
    return out;
  }
}
