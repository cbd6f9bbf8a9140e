// The graph as the report sees it: the view-model from Python, indexed, plus which boxes are open.
// Every fact about the graph (labels, boundaries, counts, kinds) comes from Python (its nodes:
// nodes.js, which also reads the readers off the inputs); this module indexes it, orders each box's items, windows boxes too big to draw (window.js) and
// keeps the open/closed state. Boxes are numbered as in the view-model; the boxes windowing adds
// ("⋯ N more", parts) get the numbers after them. The model itself is the box -1.
// No DOM: web/tests runs it under `node --test`.
import { Nodes } from "./nodes.js";
import { LEVEL_MAX, PART_MAX, RUN_WINDOW, STATE_MAX, windowPlan } from "./window.js";
import { grouped } from "./text.js";

/** Boxes nested deeper than this stay closed, marked with how deep they go: a drawing of 5,000
 * nested boxes would be 5,000 frames around one op. */
export const MAX_DEPTH = 48;
export const ROOT = -1;

/** A value reference as the view-model writes it (a node index, or [node, output] for an output
 * other than the first) as [node, output]. */
export function valueRefs(list) {
  return (list || []).map((r) => (Array.isArray(r) ? r : [r, 0]));
}

/** The kind of box g: "module", "run", "values", "region", "plumbing", or "more" (windowing). */
export function groupKind(g) {
  return g.k || (g.syn ? "more" : g.run ? "run" : g.io ? "values" : "module");
}

export class Model extends Nodes {
  constructor(data) {
    super(data);
    this.groups = data.groups.slice();
    this.real = data.groups.length;
    this.expanded = new Set();
    // what the drawing leaves out (phase.js: the other pass of a training step), by key
    this.hidden = new Set();
    this.ng = Int32Array.from(data.nodes.g);
    this.gp = this.groups.map((g) => g.p);
    this.kinds = this.groups.map(groupKind);
    this.orderItems();
    this.window();
    this.index();
  }

  // ---- building ------------------------------------------------------------------------------

  /** Each box's items (nodes and boxes directly inside it) in drawing order: the model's inputs
   * first, then graph order (a box where its first op is), the model's outputs last. Written as
   * numbers (`itemCodes` from `itemOff[c + 1]` to `itemOff[c + 2]`: node i as i, box j as ~j);
   * `items(c)` makes a box's list of keys when first asked for (100,000 nodes: this runs before
   * the first view, which lists the items of a few boxes). */
  orderItems() {
    const n = this.count;
    const G = this.groups.length;
    const { ng, gp, op, opKinds } = this;
    // the first node of each box's subtree (n: none), and the boxes that start at each node, in
    // box order, as linked lists: no sort, no map
    const first = new Int32Array(G).fill(n);
    for (let i = 0; i < n; i++) {
      for (let g = ng[i]; g >= 0 && first[g] > i; g = gp[g]) first[g] = i;
    }
    const head = new Int32Array(n + 1).fill(-1);
    const next = new Int32Array(G);
    for (let j = G - 1; j >= 0; j--) {
      next[j] = head[first[j]];
      head[first[j]] = j;
    }
    // slots per box (c + 1), then the items in order: inputs, boxes before their first node and
    // the other nodes in graph order, boxes that hold no node, outputs
    const off = (this.itemOff = new Int32Array(G + 2));
    const states = (this.stateItems = new Int32Array(G + 1));
    for (let i = 0; i < n; i++) {
      off[ng[i] + 2] += 1;
      if (this.isStateNode(i)) states[ng[i] + 1] += 1;
    }
    for (let j = 0; j < G; j++) off[gp[j] + 2] += 1;
    for (let c = 1; c < G + 2; c++) off[c] += off[c - 1];
    const codes = (this.itemCodes = new Int32Array(n + G));
    const fill = off.slice(0, G + 1);
    for (let i = 0; i < n; i++) if (opKinds[op[i]] === "input") codes[fill[ng[i] + 1]++] = i;
    for (let i = 0; i <= n; i++) {
      for (let j = head[i]; j >= 0; j = next[j]) codes[fill[gp[j] + 1]++] = ~j;
      if (i === n) break;
      const k = opKinds[op[i]];
      if (k !== "input" && k !== "output") codes[fill[ng[i] + 1]++] = i;
    }
    for (let i = 0; i < n; i++) if (opKinds[op[i]] === "output") codes[fill[ng[i] + 1]++] = i;
    this.itemsOf = new Map();
  }

  /** Apply window.js to every box, including the boxes it adds. */
  window() {
    // only the boxes window.js would change (it leaves the others as they are): their numbers
    // need no list of keys
    const work = [];
    for (let c = ROOT; c < this.real; c++) {
      const n = this.itemOff[c + 2] - this.itemOff[c + 1];
      if (n > LEVEL_MAX || (this.kinds[c] === "run" && n > RUN_WINDOW) || this.stateItems[c + 1] > STATE_MAX) work.push(c);
    }
    while (work.length) {
      const c = work.pop();
      const items = this.items(c);
      const kind = c === ROOT ? "model" : this.kinds[c] === "more" && this.groups[c].syn === "state" ? "state" : this.kinds[c];
      const plan = windowPlan(items, { isBox: (k) => k[0] === "g", isState: (k) => this.isState(k), kind });
      if (!plan) continue;
      const made = [];
      const list = plan.map((e) => this.materialize(e, c, made));
      this.itemsOf.set(c, list);
      work.push(...made);
      if (list.length > (kind === "more" || kind === "state" ? PART_MAX : LEVEL_MAX)) work.push(c);
    }
  }

  /** Turn a placeholder of windowPlan into a box (and its nested placeholders into boxes). */
  materialize(entry, parent, made) {
    if (typeof entry === "string") {
      this.setParent(entry, parent);
      return entry;
    }
    const j = this.groups.length;
    const pg = parent >= 0 ? this.groups[parent] : null;
    const g = { p: parent, l: "", path: pg ? pg.path : "", cls: "", call: 0, d: pg ? pg.d : 1, run: 0, params: 0,
      pl: "", ops: 0, c: "#8a94a6", syn: entry.role, k: "more" };
    this.groups.push(g);
    this.gp.push(parent);
    this.kinds.push("more");
    this.itemsOf.set(j, []);
    const items = entry.more.map((e) => this.materialize(e, j, made));
    this.itemsOf.set(j, items);
    let nodes = 0;
    let ops = 0;
    for (const k of items) {
      if (k[0] === "n") { nodes += 1; ops += this.nodeKind(+k.slice(1)) === "op" ? 1 : 0; }
      else { const x = this.groups[+k.slice(1)]; ops += x.ops || 0; if (x.err) g.err = 1; }
      if (k[0] === "n" && this.error(+k.slice(1))) g.err = 1;
    }
    g.ops = ops;
    g.n = items.length;
    const first = this.labelOf(items[0]);
    const last = this.labelOf(items[items.length - 1]);
    if (entry.role === "state") {
      const kinds = new Set(entry.more.map((k) => this.nodeKind(+k.slice(1))));
      g.l = `${grouped(entry.more.length)} ${kinds.size === 1 ? [...kinds][0] + "s" : "parameters and constants"}`;
      g.sub = `${first} … ${last}`;
    } else {
      g.l = entry.role === "more" ? `⋯ ${grouped(items.length)} more` : `${first} … ${last}`;
      g.sub = entry.role === "more" ? `${first} … ${last}` : `${grouped(items.length)} items`;
    }
    made.push(j);
    return "g" + j;
  }

  /** A parameter, buffer or constant that reads nothing: what windowing gathers when many. */
  isState(key) {
    return key[0] === "n" && this.isStateNode(+key.slice(1));
  }

  isStateNode(i) {
    const k = this.nodeKind(i);
    return (k === "parameter" || k === "buffer" || k === "constant") && this.inOff[i] === this.inOff[i + 1];
  }

  setParent(key, parent) {
    if (key[0] === "n") this.ng[+key.slice(1)] = parent;
    else this.gp[+key.slice(1)] = parent;
  }

  /** Depths, a pre-order numbering of boxes (so "inside" is a range test), and the nodes of each
   * box's subtree as one slice of `this.order`. No recursion: boxes can nest thousands deep. */
  index() {
    const G = this.groups.length;
    this.depth = new Int32Array(G);
    this.tin = new Int32Array(G);
    this.tout = new Int32Array(G);
    let t = 1; // the model is 0
    // [box, its list of keys (a windowed box) or null (its numbers), where the walk is in it]
    const at = (c) => {
      const list = this.itemsOf.get(c) || null;
      return [c, list, list ? 0 : this.itemOff[c + 1]];
    };
    const stack = [at(ROOT)];
    while (stack.length) {
      const top = stack[stack.length - 1];
      const [c, list] = top;
      let j = -1;
      let x = top[2];
      if (list) {
        for (; x < list.length && j < 0; x++) if (list[x][0] === "g") j = +list[x].slice(1);
      } else {
        for (const end = this.itemOff[c + 2]; x < end && j < 0; x++) if (this.itemCodes[x] < 0) j = ~this.itemCodes[x];
      }
      top[2] = x;
      if (j >= 0) {
        this.depth[j] = c === ROOT ? 1 : this.depth[c] + 1;
        this.tin[j] = t++;
        stack.push(at(j));
        continue;
      }
      stack.pop();
      if (c !== ROOT) this.tout[c] = t - 1;
    }
    this.boxCount = t;
    // nodes ordered by their box's number: a box's subtree is one slice
    const count = new Int32Array(t + 1);
    const tinOf = (c) => (c === ROOT ? 0 : this.tin[c]);
    for (let i = 0; i < this.count; i++) count[tinOf(this.ng[i]) + 1]++;
    for (let x = 1; x <= t; x++) count[x] += count[x - 1];
    this.start = count.slice(); // start[tin] = first position of nodes in a box numbered tin
    this.order = new Int32Array(this.count);
    const fill = count.slice();
    for (let i = 0; i < this.count; i++) this.order[fill[tinOf(this.ng[i])]++] = i;
  }

  // ---- facts from the view-model (a node's: nodes.js) -----------------------------------------

  /** What box g reads from outside and hands back: { ins, outs }, each [[node, output], ...],
   * the main result first. */
  boundary(g) {
    return { ins: valueRefs(this.groups[g].ins), outs: valueRefs(this.groups[g].outs) };
  }

  /** True when the failing op of a partial graph is inside box g. */
  hasError(g) {
    return Boolean(this.groups[g].err);
  }

  kind(g) {
    return this.kinds[g];
  }

  isRun(g) {
    return this.kinds[g] === "run";
  }

  isValues(g) {
    return this.kinds[g] === "values";
  }

  labelOf(key) {
    return key[0] === "n" ? this.label(+key.slice(1)) : this.groups[+key.slice(1)].l;
  }

  // ---- structure -----------------------------------------------------------------------------

  /** The box directly holding item `key` ("n12", "g3"); ROOT for the model. */
  parentOf(key) {
    return key[0] === "n" ? this.ng[+key.slice(1)] : this.gp[+key.slice(1)];
  }

  /** The keys of box c's items ("n12", "g3"), in drawing order (a view: do not modify). */
  items(c) {
    let list = this.itemsOf.get(c);
    if (!list) {
      list = [];
      for (let x = this.itemOff[c + 1]; x < this.itemOff[c + 2]; x++) {
        const code = this.itemCodes[x];
        list.push(code >= 0 ? "n" + code : "g" + ~code);
      }
      this.itemsOf.set(c, list);
    }
    return list;
  }

  /** True when box c is `anc` or lies inside it (ROOT holds everything). */
  inside(c, anc) {
    if (anc === ROOT) return true;
    if (c === ROOT) return false;
    return this.tin[anc] <= this.tin[c] && this.tin[c] <= this.tout[anc];
  }

  /** The nodes inside box c, at any depth (a view into one array: do not modify). */
  subtreeNodes(c) {
    const a = c === ROOT ? 0 : this.tin[c];
    const b = c === ROOT ? this.boxCount - 1 : this.tout[c];
    return this.order.subarray(this.start[a], this.start[b + 1]);
  }

  /** Key of box c's item that holds node i (i itself, or the child box around it). */
  itemAt(c, i) {
    let g = this.ng[i];
    if (g === c) return "n" + i;
    while (this.gp[g] !== c) g = this.gp[g];
    return "g" + g;
  }

  /** Box c and the boxes around it, innermost first (ROOT not included). */
  ancestors(c) {
    const out = [];
    for (let g = c; g >= 0; g = this.gp[g]) out.push(g);
    return out;
  }

  /** Whether box g may be opened: it holds something and is not nested too deep. */
  canExpand(g) {
    return this.depth[g] <= MAX_DEPTH && this.items(g).length > 0;
  }

  /** Levels of boxes below box g (0 for a box of nodes only); for the marker on a box too deep
   * to open. */
  height(g) {
    let best = 0;
    const stack = [[g, 0]];
    while (stack.length) {
      const [c, d] = stack.pop();
      best = Math.max(best, d);
      for (const k of this.items(c)) if (k[0] === "g") stack.push([+k.slice(1), d + 1]);
    }
    return best;
  }

  // ---- open and closed -----------------------------------------------------------------------

  isOpen(c) {
    return c === ROOT || this.expanded.has(c);
  }

  /** The outermost closed box hiding box c (or c itself when closed), or -1 when c is drawn open. */
  hidingGroup(c) {
    let hid = -1;
    for (let g = c; g >= 0; g = this.gp[g]) if (!this.expanded.has(g)) hid = g;
    return hid;
  }

  /** Key of what stands for node i in the drawing: the node itself or the box that hides it. */
  repOfNode(i) {
    const g = this.hidingGroup(this.ng[i]);
    return g < 0 ? "n" + i : "g" + g;
  }

  /** Key of what stands for `key` (a node or a box) in the drawing. */
  repOf(key) {
    if (key[0] === "n") return this.repOfNode(+key.slice(1));
    const g = this.hidingGroup(this.gp[+key.slice(1)]);
    return g < 0 ? key : "g" + g;
  }

  /** Open every box around node i so that it is drawn (as deep as MAX_DEPTH allows). Returns
   * true if anything changed. */
  revealNode(i) {
    return this.open(this.ancestors(this.ng[i]));
  }

  /** Open every box around box g so that g itself is drawn. */
  revealGroup(g) {
    return this.open(this.ancestors(this.gp[g]));
  }

  open(list) {
    let changed = false;
    for (const j of list) {
      if (!this.expanded.has(j) && this.canExpand(j)) {
        this.expanded.add(j);
        changed = true;
      }
    }
    return changed;
  }

  /** Close box g and everything inside it, so that opening it again shows one level. */
  collapse(g) {
    for (const j of [...this.expanded]) if (this.inside(j, g)) this.expanded.delete(j);
  }

  /** Open box g if it may be opened; close it if open. Returns true when it changed. */
  toggle(g) {
    if (this.expanded.has(g)) {
      this.collapse(g);
      return true;
    }
    return this.open([g]);
  }

  /** Boxes the first view may open: modules and regions that hold other boxes. Runs of repeats,
   * boxes of inputs or outputs, plumbing and windowing boxes stay closed: they are the summary,
   * and a module of ops only is already said by its closed box. */
  opensFirst(g) {
    const k = this.kinds[g];
    return (k === "module" || k === "region") && this.canExpand(g) && this.items(g).some((x) => x[0] === "g");
  }

  /** The first view's candidates, breadth-first: step s opens the boxes of level s that
   * `opensFirst`, while the drawn items stay within `budget` (a view of at most three boxes at
   * the top is a wrapper: its boxes open whatever the budget). Returns the list of steps; the
   * viewer opens them in turn and stops at the last one that fits on screen. */
  firstViewSteps(budget) {
    const steps = [];
    let count = this.items(ROOT).length;
    const topBoxes = this.items(ROOT).filter((k) => k[0] === "g").map((k) => +k.slice(1));
    let frontier = topBoxes;
    let wrapper = topBoxes.filter((g) => !this.isValues(g)).length <= 3;
    while (frontier.length) {
      const step = [];
      const next = [];
      for (const g of frontier) {
        if (!this.opensFirst(g)) continue;
        const extra = this.items(g).length - 1;
        if (count + extra > budget && !wrapper) continue;
        step.push(g);
        count += extra;
        for (const k of this.items(g)) if (k[0] === "g") next.push(+k.slice(1));
      }
      if (!step.length) break;
      steps.push(step);
      wrapper = wrapper && step.length <= 3 && next.filter((g) => this.opensFirst(g)).length <= 3;
      frontier = next;
    }
    return steps;
  }
}
