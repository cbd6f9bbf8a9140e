// The graph as the report sees it: the view-model from Python, indexed, plus which module boxes
// are expanded. `visibleGraph()` turns that state into the boxes, nodes and edges to lay out.
// Every fact about the graph (labels, readers, boundaries, counts) comes from Python; this module
// only indexes it and decides what is visible. No DOM: web/tests runs it under `node --test`.

/** A value reference as the view-model writes it (a node index, or [node, output] for an output
 * other than the first) as [node, output]. */
export function valueRefs(list) {
  return (list || []).map((r) => (Array.isArray(r) ? r : [r, 0]));
}

export class Model {
  constructor(data) {
    this.data = data;
    this.nodes = data.nodes;
    this.groups = data.groups;
    this.metas = data.metas;
    this.sources = data.sources;
    this.expanded = new Set();
    this.byName = new Map(this.nodes.map((n, i) => [n.n, i]));

    // children of each box (boxes and nodes), and each box's chain of boxes, outermost first
    this.childGroups = this.groups.map(() => []);
    this.childNodes = this.groups.map(() => []);
    this.rootGroups = [];
    this.rootNodes = [];
    this.groups.forEach((g, i) => (g.p < 0 ? this.rootGroups : this.childGroups[g.p]).push(i));
    this.nodes.forEach((n, i) => (n.g < 0 ? this.rootNodes : this.childNodes[n.g]).push(i));
    this.chain = this.groups.map((g, i) => {
      const out = [];
      for (let j = i; j >= 0; j = this.groups[j].p) out.unshift(j);
      return out;
    });
  }

  /** [[producer index, output index], ...] of node i. */
  inputs(i) {
    return valueRefs(this.nodes[i].i);
  }

  /** Indices of the nodes that read node i, in graph order. */
  users(i) {
    return this.nodes[i].u || [];
  }

  /** What box g reads from outside and hands back: { ins, outs }, each [[node, output], ...],
   * the main result first. */
  boundary(g) {
    return { ins: valueRefs(this.groups[g].ins), outs: valueRefs(this.groups[g].outs) };
  }

  /** True when the failing op of a partial graph is inside box g. */
  hasError(g) {
    return Boolean(this.groups[g].err);
  }

  /** [shape string, dtype, edge label] of output k of node i, or null. */
  meta(i, k = 0) {
    const out = this.nodes[i].out;
    return out && k < out.length ? this.metas[out[k]] : null;
  }

  isRun(g) {
    return this.groups[g].run > 0;
  }

  /** True for a box of the model's inputs or outputs (a cache's 96 tensors), not a module. */
  isValues(g) {
    return Boolean(this.groups[g].io);
  }

  /** The outermost collapsed box hiding box g (or node i's box), or -1 when it is visible. */
  hidingGroup(g) {
    if (g < 0) return -1;
    for (const j of this.chain[g]) if (!this.expanded.has(j)) return j;
    return -1;
  }

  /** Key of what stands for node i in the drawing: the node itself or the box that hides it. */
  repOfNode(i) {
    const g = this.hidingGroup(this.nodes[i].g);
    return g < 0 ? "n" + i : "g" + g;
  }

  /** True when box g (a descendant box) lies inside box anc. */
  within(g, anc) {
    return g >= 0 && this.chain[g].includes(anc);
  }

  /** Expand every box around node i (or box g) so that it is drawn. Returns true if anything changed. */
  revealNode(i) {
    const g = this.nodes[i].g;
    return g >= 0 ? this.revealGroupContents(this.chain[g]) : false;
  }

  revealGroup(g) {
    return this.revealGroupContents(this.chain[g].slice(0, -1));
  }

  revealGroupContents(list) {
    let changed = false;
    for (const j of list) if (!this.expanded.has(j)) { this.expanded.add(j); changed = true; }
    return changed;
  }

  /** Collapse box g and everything inside it, so that expanding it again shows one level. */
  collapse(g) {
    for (const j of [...this.expanded]) if (this.within(j, g)) this.expanded.delete(j);
  }

  /** The first view: expand boxes breadth-first, outermost first, while the number of drawn
   * items stays within the budget. Runs of folded repeats and boxes of inputs or outputs stay
   * folded: they are the summary. */
  expandToBudget(budget) {
    let count = this.rootGroups.length + this.rootNodes.length;
    const top = this.rootGroups.filter((g) => !this.isValues(g));
    let frontier = top;
    while (frontier.length) {
      const next = [];
      for (const g of frontier) {
        if (this.isRun(g)) continue;
        const extra = this.childGroups[g].length + this.childNodes[g].length - 1;
        // a view of one or two boxes (a model wrapping its backbone) says nothing: open them
        // even past the budget
        const few = frontier === top && top.length <= 3;
        if (count + extra > budget && !few) continue;
        this.expanded.add(g);
        count += extra;
        next.push(...this.childGroups[g]);
      }
      frontier = next;
    }
  }

  /** What to draw now: leaves (nodes and collapsed boxes), clusters (expanded boxes) and the
   * edges between leaves, merged when several values flow between the same two leaves. */
  visibleGraph() {
    const leaves = [];
    const clusters = [];
    const visit = (groupsList, nodesList) => {
      for (const g of groupsList) {
        if (this.expanded.has(g)) {
          clusters.push(g);
          visit(this.childGroups[g], this.childNodes[g]);
        } else leaves.push("g" + g);
      }
      for (const i of nodesList) leaves.push("n" + i);
    };
    visit(this.rootGroups, this.rootNodes);

    const edges = new Map();
    this.nodes.forEach((n, dst) => {
      const to = this.repOfNode(dst);
      this.inputs(dst).forEach(([src, k]) => {
        const from = this.repOfNode(src);
        if (from === to) return;
        const key = from + ">" + to;
        const e = edges.get(key);
        // count values, not uses: one tensor read twice inside a box is still one value
        if (e) e.values.add(src + ":" + k);
        else {
          const m = this.meta(src, k);
          edges.set(key, { from, to, label: m ? m[2] : "", src, dst, values: new Set([src + ":" + k]) });
        }
      });
    });
    for (const e of edges.values()) e.count = e.values.size;
    const list = [...edges.values()];
    markStubs(leaves, list);
    return { leaves, clusters, edges: list };
  }
}

/** An end shared by at least FAN other leaves makes a fan; its edges that skip more than SPAN
 * ranks are drawn as stubs. */
export const FAN = 6;
export const SPAN = 4;

/** Mark the long edges of fans as stubs (`e.stub = "in"`: drawn as a short arrow into its
 * target, naming the source; `"out"`: a short arrow out of its source, naming the target).
 *
 * An attention mask read by each of 48 blocks, or 48 blocks writing one cache box, would thread
 * 48 lines down the whole drawing: the layout grows wide and slow (dagre routes a long edge
 * through a dummy node on every rank it skips), and the lines say nothing an arrow naming the
 * other end does not. The nearest edge of each fan stays a real edge, so the shared end is
 * still placed next to its first reader (or last writer). Ranks are longest paths over the
 * leaves; a cycle is broken where it is met. */
export function markStubs(leaves, edges) {
  const rank = longestPathRanks(leaves, edges);
  const span = (e) => rank.get(e.to) - rank.get(e.from);
  const byEnd = (end) => {
    const m = new Map();
    for (const e of edges) if (!e.stub) (m.get(e[end]) || m.set(e[end], []).get(e[end])).push(e);
    return m;
  };
  for (const fan of byEnd("from").values()) {
    if (fan.length < FAN) continue;
    fan.sort((a, b) => span(a) - span(b));
    for (const e of fan.slice(1)) if (span(e) > SPAN) e.stub = "in";
  }
  for (const fan of byEnd("to").values()) {
    if (fan.length < FAN) continue;
    fan.sort((a, b) => span(a) - span(b));
    for (const e of fan.slice(1)) if (span(e) > SPAN) e.stub = "out";
  }
}

/** Rank of each leaf: the length of the longest path of edges reaching it (Kahn's order). A
 * cycle (two collapsed boxes feeding each other) is broken at its first leaf in drawing order. */
export function longestPathRanks(leaves, edges) {
  const indeg = new Map(leaves.map((k) => [k, 0]));
  const out = new Map(leaves.map((k) => [k, []]));
  for (const e of edges) {
    indeg.set(e.to, indeg.get(e.to) + 1);
    out.get(e.from).push(e.to);
  }
  const rank = new Map(leaves.map((k) => [k, 0]));
  const queue = leaves.filter((k) => indeg.get(k) === 0);
  const queued = new Set(queue);
  let next = 0; // leaves before this index are queued, when a cycle needs breaking
  for (let i = 0; queued.size < leaves.length || i < queue.length; i++) {
    if (i === queue.length) {
      while (queued.has(leaves[next])) next++;
      queue.push(leaves[next]);
      queued.add(leaves[next]);
    }
    const k = queue[i];
    for (const t of out.get(k)) {
      if (queued.has(t)) continue; // a back edge of a broken cycle
      rank.set(t, Math.max(rank.get(t), rank.get(k) + 1));
      indeg.set(t, indeg.get(t) - 1);
      if (indeg.get(t) === 0) {
        queue.push(t);
        queued.add(t);
      }
    }
  }
  return rank;
}
