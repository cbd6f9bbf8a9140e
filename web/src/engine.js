// Hierarchical layout: each open box is laid out on its own (levels.js, layout.js) with its open
// boxes inside as blocks of their own size, and the result is cached by the box and the state of
// everything inside it. Opening or closing a box lays out that box (once) and the boxes around
// it, each only with its own items; every other open box keeps its layout, and what lies inside
// it keeps its place relative to it. A toggle therefore costs the same however many other boxes
// are open. No DOM here (the text measuring function is passed in): web/tests runs it with a
// stand-in measure and layout.js directly.
import { levelGraph } from "./levels.js";
import { ROOT } from "./model.js";

/**
 * `measure`: `{ leaf(key) -> {w, h}, room(stubs) -> [left, right], title(c) -> w,
 * edgeLabel(label) -> [w, h] }`; `run(jobs) -> Promise<results>` runs layout.js's layoutBatch,
 * in a worker or not.
 */
export class Engine {
  constructor(model, measure, run) {
    this.model = model;
    this.measure = measure;
    this.run = run;
    this.levels = new Map();
    this.cache = new Map();
    this.ids = new Map();
    this.nextId = 0; // never reused, even after reset: the scene keeps drawings by layout id
    this.keyOf = new Map();
    this.leafSizes = new Map();
    this.last = { jobs: 0, items: 0 };
    this.total = { jobs: 0, items: 0 };
  }

  /** Forget every level and layout (what the model hides changed); new layouts get new ids. */
  reset() {
    this.levels.clear();
    this.cache.clear();
    this.ids.clear();
    this.keyOf.clear();
  }

  /** The level of box c, its jobs' fixed part, and each item's room for stubs (computed once). */
  level(c) {
    let lv = this.levels.get(c);
    if (lv) return lv;
    lv = levelGraph(this.model, c);
    const index = new Map(lv.items.map((k, i) => [k, i]));
    const at = (k) => (k === "in" ? -1 : k === "out" ? -2 : index.get(k));
    lv.index = index;
    lv.drawn = lv.edges.filter((e) => !e.stub);
    lv.jobEdges = lv.drawn.map((e) => [at(e.from), at(e.to), ...this.measure.edgeLabel(e.label)]);
    lv.room = lv.items.map((k) => this.measure.room(lv.stubs.get(k)));
    lv.title = c === ROOT ? 0 : this.measure.title(c);
    this.levels.set(c, lv);
    return lv;
  }

  leaf(key) {
    let v = this.leafSizes.get(key);
    if (!v) this.leafSizes.set(key, (v = this.measure.leaf(key)));
    return v;
  }

  /** The open boxes (of `open`, a set of box numbers: what is open now by default), each after
   * the open boxes inside it (ROOT last). No recursion. */
  openPostOrder(open = this.model.expanded) {
    const m = this.model;
    const out = [];
    const stack = [[ROOT, false]];
    while (stack.length) {
      const [c, done] = stack.pop();
      if (done) {
        out.push(c);
        continue;
      }
      stack.push([c, true]);
      for (const k of m.items(c)) if (k[0] === "g" && open.has(+k.slice(1))) stack.push([+k.slice(1), false]);
    }
    return out;
  }

  /** The layout keys of the open boxes of state `open` (box -> key, in post order), adding to
   * `batch` ({ jobs, queued: key -> job index }) the jobs of those whose layout is not cached. */
  plan(open, batch) {
    const keys = new Map();
    for (const c of this.openPostOrder(open)) {
      const lv = this.level(c);
      const kids = [];
      for (const k of lv.items) if (k[0] === "g" && open.has(+k.slice(1))) kids.push(keys.get(+k.slice(1)));
      const text = c + "|" + kids.join(",");
      let id = this.ids.get(text);
      if (id === undefined) this.ids.set(text, (id = this.nextId++));
      keys.set(c, id);
      if (this.cache.has(id) || batch.queued.has(id)) continue;
      batch.queued.set(id, batch.jobs.length);
      batch.jobs.push({ c, id, job: this.job(c, lv, keys, batch.queued, open) });
    }
    return keys;
  }

  /** Lay out the jobs of a batch in one trip to the worker and cache the results. */
  async runBatch(batch) {
    // what the page did itself (levels, sizes) before handing the jobs to dagre
    if (typeof performance !== "undefined" && performance.mark) performance.mark("fxviz:prepared");
    const jobs = batch.jobs;
    this.last = { jobs: jobs.length, items: jobs.reduce((a, j) => a + j.job.items.length, 0) };
    this.total.jobs += this.last.jobs;
    this.total.items += this.last.items;
    if (jobs.length) {
      const results = await this.run(jobs.map((j) => j.job));
      jobs.forEach((j, i) => this.cache.set(j.id, results[i]));
    }
  }

  /** Lay out what is open now: only boxes whose state is new are laid out. Resolves to the list
   * of open boxes whose layout changed since the last update (their drawing must be rebuilt). */
  async update() {
    const batch = { jobs: [], queued: new Map() };
    const keys = this.plan(this.model.expanded, batch);
    await this.runBatch(batch);
    const changed = [...keys.keys()].filter((c) => this.keyOf.get(c) !== keys.get(c));
    this.keyOf = keys;
    return changed;
  }

  /** The size of the whole drawing in each of `states` (sets of open boxes), laid out in one
   * batch: the first view weighs several, and each trip to the worker costs a wait. Their
   * layouts stay cached, so drawing the chosen one lays out nothing more. */
  async sizes(states) {
    const batch = { jobs: [], queued: new Map() };
    const keys = states.map((open) => this.plan(open, batch));
    await this.runBatch(batch);
    return keys.map((k) => {
      const r = this.cache.get(k.get(ROOT));
      return [r.w, r.h];
    });
  }

  job(c, lv, keys, queued, open) {
    const items = lv.items.map((k, i) => {
      const [rl, rr] = lv.room[i];
      const off = (rl - rr) / 2;
      if (k[0] === "g" && open.has(+k.slice(1))) {
        const g = +k.slice(1);
        const id = keys.get(g);
        if (queued.has(id)) return { ref: queued.get(id), rl, rr };
        const r = this.cache.get(id);
        return { w: r.w + rl + rr, h: r.h, ai: off + r.inX - r.w / 2, ao: off + r.outX - r.w / 2 };
      }
      const s = this.leaf(k);
      return { w: s.w + rl + rr, h: s.h, ai: off, ao: off };
    });
    return { root: c === ROOT, title: lv.title, items, edges: lv.jobEdges, ports: lv.ports };
  }

  /** The layout of open box c as of the last update. */
  result(c) {
    return this.cache.get(this.keyOf.get(c));
  }

  /** The layout key of open box c (same key: same drawing). */
  key(c) {
    return this.keyOf.get(c);
  }

  /** Where item `key` of box c is drawn, relative to c's top-left: its layout slot's centre and
   * size, and the drawn shape's rectangle (the slot less the room kept for stubs). */
  slot(c, key) {
    const lv = this.level(c);
    const r = this.result(c);
    const i = lv.index.get(key);
    const [rl, rr] = lv.room[i];
    const g = key[0] === "g" && this.model.expanded.has(+key.slice(1)) ? this.result(+key.slice(1)) : null;
    const s = g ? { w: g.w, h: g.h } : this.leaf(key);
    const cx = r.x[i] + (rl - rr) / 2;
    return { x: cx - s.w / 2, y: r.y[i] - s.h / 2, w: s.w, h: s.h, slotW: s.w + rl + rr };
  }

  /** Top-left of open box c in the coordinates of the whole drawing. */
  origin(c) {
    let x = 0;
    let y = 0;
    for (let g = c; g !== ROOT; g = this.model.gp[g]) {
      const s = this.slot(this.model.gp[g], "g" + g);
      x += s.x;
      y += s.y;
    }
    return [x, y];
  }

  /** The rectangle of a drawn item (a leaf or an open box) in drawing coordinates. */
  rect(key) {
    const c = this.model.parentOf(key);
    const s = this.slot(c, key);
    const [x, y] = this.origin(c);
    return { x: x + s.x, y: y + s.y, w: s.w, h: s.h };
  }

  /** Size of the whole drawing. */
  size() {
    const r = this.result(ROOT);
    return r ? [r.w, r.h] : [0, 0];
  }
}
