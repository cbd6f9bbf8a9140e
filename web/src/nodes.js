// The nodes of the view-model as the report reads them: the columns Python writes (html.py's
// _node_columns: one list per field, and the table of what nodes share, [kind, family, label,
// target], that each node points into), the data flow as flat arrays, and each node's facts by
// index. The Model (model.js) is this and the boxes. No DOM: web/tests runs it under `node --test`.

/** The page's second block (html.split_view_model: each node's attributes, each box's
 * boundary, the values of the overlays the report does not open with) merged into `data`, the
 * first. What the first block already has stays: a page written in one block has everything
 * there. */
export function mergeLater(data, later) {
  for (const [k, v] of Object.entries(later.nodes || {})) if (!(k in data.nodes)) data.nodes[k] = v;
  (later.boundaries || []).forEach(([ins, outs], j) => {
    const g = data.groups[j];
    if (ins.length && !g.ins) g.ins = ins;
    if (outs.length && !g.outs) g.outs = outs;
  });
  for (const ov of data.overlays || []) {
    const values = (later.overlays || {})[ov.name];
    if (values && !ov.nodes) Object.assign(ov, values);
  }
  return data;
}

export class Nodes {
  constructor(data) {
    this.data = data;
    const nodes = data.nodes;
    this.count = nodes.n.length;
    this.nodeNames = nodes.n;
    this.ops = data.ops;
    this.op = Int32Array.from(nodes.f);
    this.opKinds = this.ops.map((o) => o[0]);
    this.errors = nodes.e || {};
    this.metas = data.metas || [];
    this.sources = data.sources || [];
    this.edgeArrays();
  }

  /** The data flow as flat arrays (inputs of node i: `inSrc`/`inOut` from `inOff[i]` to
   * `inOff[i + 1]`; readers, each once and in graph order: `uDst` from `uOff[i]`; the `metas`
   * entries of its outputs: `outMeta` from `outOff[i]`). The view-model writes inputs only:
   * readers are the same edges read the other way. */
  edgeArrays() {
    const n = this.count;
    const { ni, i: refs, no, out } = this.data.nodes;
    const inOff = (this.inOff = new Int32Array(n + 1));
    const outOff = (this.outOff = new Int32Array(n + 1));
    for (let t = 0; t < n; t++) {
      inOff[t + 1] = inOff[t] + ni[t];
      outOff[t + 1] = outOff[t] + no[t];
    }
    this.outMeta = Int32Array.from(out);
    const inSrc = (this.inSrc = new Int32Array(inOff[n]));
    this.inOut = new Int32Array(inOff[n]);
    for (let j = 0; j < inOff[n]; j++) {
      const r = refs[j];
      if (typeof r === "number") inSrc[j] = r;
      else {
        inSrc[j] = r[0];
        this.inOut[j] = r[1];
      }
    }
    // readers: a node that reads a value twice reads it once; nodes come in graph order, so a
    // repeat is the last reader written
    const uOff = (this.uOff = new Int32Array(n + 1));
    const last = new Int32Array(n).fill(-1);
    for (let t = 0; t < n; t++) {
      for (let j = inOff[t]; j < inOff[t + 1]; j++) {
        const s = inSrc[j];
        if (last[s] !== t) {
          last[s] = t;
          uOff[s + 1] += 1;
        }
      }
    }
    for (let t = 0; t < n; t++) uOff[t + 1] += uOff[t];
    const fill = uOff.slice(0, n);
    const uDst = (this.uDst = new Int32Array(uOff[n]));
    last.fill(-1);
    for (let t = 0; t < n; t++) {
      for (let j = inOff[t]; j < inOff[t + 1]; j++) {
        const s = inSrc[j];
        if (last[s] !== t) {
          last[s] = t;
          uDst[fill[s]++] = t;
        }
      }
    }
  }

  /** Node i's name (what its search, links and the URL call it). */
  name(i) {
    return this.nodeNames[i];
  }

  /** Node i's kind: "op", "input", "output", "parameter", "buffer", "constant", "call". */
  nodeKind(i) {
    return this.opKinds[this.op[i]];
  }

  /** Node i's op family (a key of the view-model's `kinds`), or its kind if it is not an op. */
  family(i) {
    return this.ops[this.op[i]][1];
  }

  /** What node i shows: the op's short name, a parameter's attribute name, ... */
  label(i) {
    return this.ops[this.op[i]][2];
  }

  /** What node i calls (or a parameter's full name, an input's argument name); "" for none. */
  target(i) {
    const t = this.ops[this.op[i]][3];
    return t === 1 ? this.nodeNames[i] : t || "";
  }

  /** The error node i raised (a partial graph's failing op), or undefined. */
  error(i) {
    return this.errors[i];
  }

  /** The failing nodes, in graph order. */
  errorNodes() {
    return Object.keys(this.errors).map(Number).sort((a, b) => a - b);
  }

  /** Node i's attributes (non-tensor arguments), parsed when asked for: the view-model keeps
   * them as one text (`a`, each node's `al` long), in the page's second block ({} until it is
   * read: the report shows details only after). */
  attrs(i) {
    const { a, al } = this.data.nodes;
    if (!al || !al[i]) return {};
    if (!this.attrAt) {
      this.attrAt = new Int32Array(this.count + 1);
      for (let k = 0; k < this.count; k++) this.attrAt[k + 1] = this.attrAt[k] + al[k];
    }
    return JSON.parse(a.slice(this.attrAt[i], this.attrAt[i + 1]));
  }

  /** Node i's entry of `sources` ([file, line, function, code]), or null. */
  source(i) {
    const s = this.data.nodes.s[i];
    return s >= 0 ? this.sources[s] : null;
  }

  /** The parameters node i holds or reads (each parameter once). */
  params(i) {
    return this.data.nodes.np[i];
  }

  /** The module box the view-model puts node i in (-1: the model), before windowing. */
  moduleOf(i) {
    return this.data.nodes.g[i];
  }

  /** How many outputs node i has. */
  outputCount(i) {
    return this.outOff[i + 1] - this.outOff[i];
  }

  /** Node i as one object, for code that shows one node: `{ n, l, k, o, t, e }`. */
  node(i) {
    const [k, o, l] = this.ops[this.op[i]];
    return { n: this.nodeNames[i], l, k, o, t: this.target(i), e: this.errors[i] };
  }

  /** The index of the node called `name`, or -1. A scan, not a map: only a link's hash asks,
   * once, and a map of 100,000 names costs ~100 ms to build. */
  nodeIndex(name) {
    return this.nodeNames.indexOf(name);
  }

  /** [[producer index, output index], ...] of node i. */
  inputs(i) {
    const out = [];
    for (let j = this.inOff[i]; j < this.inOff[i + 1]; j++) out.push([this.inSrc[j], this.inOut[j]]);
    return out;
  }

  /** Indices of the nodes that read node i, in graph order. */
  users(i) {
    return Array.from(this.uDst.subarray(this.uOff[i], this.uOff[i + 1]));
  }

  /** [shape string, dtype, edge label] of output k of node i, or null. */
  meta(i, k = 0) {
    return k < this.outputCount(i) ? this.metas[this.outMeta[this.outOff[i] + k]] : null;
  }

  /** Node i's colour: its op family's, from the view-model's table. */
  color(i) {
    return (this.data.kinds && this.data.kinds[this.family(i)]) || "#607d8b";
  }
}
