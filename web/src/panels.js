// The panels around the graph: capture banners, details of the selection, the module tree, the
// legend. Every fact shown comes from the view-model.
import { action, grouped, h } from "./dom.js";
import { formatValue } from "./overlay.js";
import { sourceLink } from "./settings.js";
import { MAX_DEPTH, ROOT } from "./model.js";
import { clip, counted, visible } from "./text.js";

/** Header text and the banners: capture method, failed attempts, partial graph, the capture's notes. */
export function renderHeader(r, data, onShowError) {
  r.model.replaceChildren(h("span", { text: data.name || "model" }));
  r.model.setAttribute("title", visible(data.name || "model"));
  const method = data.method || "unknown method";
  // the attempts that failed before the one that made the graph (a model that raised fails its
  // last attempt too, and that attempt still made the graph)
  const fell = data.attempts.filter((a) => !a.ok && a.method !== data.method);
  // how the graph was captured, in words that cannot be read as what an analysis found ("eager"
  // alone on a compile page read as "ran eagerly")
  r.method.textContent = data.captured || `captured by ${method}`;
  r.method.classList.toggle("fx-fallback", fell.length > 0);
  r.method.title = `how this graph was captured (capture method: ${method}); an analysis's findings are on the page, not here`;
  const t = data.totals;
  r.totals.textContent = `${counted(t.ops, "op")} · ${t.pl || 0} params · ${counted(t.nodes, "node")}`;

  const banners = [];
  if (data.error) {
    banners.push(
      h("div", { class: "fx-banner fx-banner-error", role: "alert" },
        h("strong", { text: "✗ Partial graph. " }),
        "The model raised during capture; the graph stops at the failing op, marked ✗: ",
        h("code", { text: data.error }), " ",
        h("button", { type: "button", onclick: onShowError, text: "Show failing node" })),
    );
  }
  if (fell.length) {
    banners.push(
      h("div", { class: "fx-banner fx-banner-warn" },
        h("strong", { text: `Captured by ${method}` }),
        `: ${counted(fell.length, "earlier method")} failed:`,
        h("ul", {}, fell.map((a) => h("li", { title: a.message }, h("code", { text: a.method }), ": ", a.reason)))),
    );
  }
  // what the capture says a reader should know (the tree prints each as "ℹ ...")
  for (const note of data.notes || []) banners.push(h("div", { class: "fx-banner fx-banner-info" }, "ℹ ", note));
  r.banners.replaceChildren(...banners);
}

function row(label, ...value) {
  return [h("dt", { text: label }), h("dd", {}, ...value)];
}

function shapeText(m) {
  return m ? `${m[0]} ${m[1]}` : "unknown";
}

/** Every overlay's value of node or box i, under one row of their own. */
function overlayRows(overlays, list, i) {
  const rows = (overlays || []).flatMap((ov) => {
    const v = (ov[list] || [])[i];
    return v === null || v === undefined ? [] : [h("dt", { text: ov.label || ov.name, title: ov.description || "" }),
      h("dd", { class: "fx-ov-value", "data-overlay": ov.name, text: formatValue(ov, v) })];
  });
  return rows.length ? row("overlays", h("dl", { class: "fx-attrs fx-overlays" }, rows)) : [];
}

function sourceRow(model, i, pattern) {
  const [file, line, func, code] = model.source(i);
  const text = `${file.split("/").pop()}:${line}${func ? ` in ${func}` : ""}`;
  const url = sourceLink(pattern, file, line, func);
  const where = url ? h("a", { class: "fx-src", href: url, title: `${file}:${line}`, target: "_blank", rel: "noopener", text }) : h("code", { class: "fx-src", title: file, text });
  return row("source", where, code ? h("pre", { text: code }) : null);
}

/** Details of node i. `go(key)` reveals and selects another node or box. */
export function nodeDetails(model, i, go, opts = {}) {
  const n = model.node(i);
  const box = model.moduleOf(i);
  const g = box >= 0 ? model.groups[box] : null;
  const link = (key, text) => action(text, () => go(key));
  const rows = [
    ...row("name", h("code", { text: n.n })),
    ...row("kind", n.k === "op" ? `op (${n.o})` : n.k),
  ];
  if (n.t) rows.push(...row(n.k === "op" ? "op" : "target", h("code", { text: n.t })));
  // the torch-level call an op came from, as a user writes it (torch.relu); its call id is the
  // capture's bookkeeping, not shown
  const attrs = model.attrs(i);
  const call = attrs.torch_fn;
  if (Array.isArray(call) && call.length === 2 && call[1] !== n.t) rows.push(...row("torch call", h("code", { text: String(call[1]) })));
  rows.push(...row("module", g ? link("g" + box, g.path) : "(model)", g && g.cls ? ` (${g.cls})` : ""));
  const ins = model.inputs(i);
  if (ins.length) {
    rows.push(...row("inputs", h("ol", { class: "fx-io" }, ins.slice(0, 64).map(([src, k]) =>
      h("li", {}, link("n" + src, model.name(src) + (k ? `[${k}]` : "")), " ", h("span", { class: "fx-shape", text: shapeText(model.meta(src, k)) })))),
    ins.length > 64 ? h("span", { class: "fx-muted", text: `… +${grouped(ins.length - 64)}` }) : null));
  }
  const outs = Math.min(model.outputCount(i), 64);
  if (outs) {
    rows.push(...row("outputs", h("ol", { class: "fx-io" }, Array.from({ length: outs }, (_, k) => h("li", {}, h("span", { class: "fx-shape", text: shapeText(model.meta(i, k)) }))))));
  }
  const users = model.users(i);
  if (users.length) {
    rows.push(...row("used by", h("span", {}, ...users.slice(0, 12).flatMap((u, j) => [j ? ", " : "", link("n" + u, model.name(u))]), users.length > 12 ? ` … +${users.length - 12}` : "")));
  }
  if (model.params(i)) rows.push(...row("parameters", grouped(model.params(i))));
  // a tied weight: the other names torch knows this tensor by (the modules that read it as theirs)
  if (Array.isArray(attrs.shared_with) && attrs.shared_with.length) rows.push(...row("shared with", h("code", { text: attrs.shared_with.join(", ") })));
  rows.push(...overlayRows(opts.overlays, "nodes", i));
  if (model.source(i)) rows.push(...sourceRow(model, i, opts.linkPattern));
  const shown = Object.entries(attrs).filter(([k]) => k !== "torch_fn" && k !== "shared_with");
  if (shown.length) {
    rows.push(...row("attributes", h("dl", { class: "fx-attrs" }, shown.flatMap(([k, v]) => [h("dt", { text: k }), h("dd", { text: typeof v === "string" ? v : JSON.stringify(v) })]))));
  }
  const mark = n.e ? "✗ " : n.o === "data-dependent" ? "⚠ " : "";
  return h("div", { class: "fx-details-body", "data-key": "n" + i },
    h("h2", {}, h("i", { class: "fx-swatch", style: { background: model.color(i) } }), mark + n.l),
    n.e ? h("div", { class: "fx-node-error", role: "alert" }, h("strong", { text: "✗ This op raised: " }), n.e) : null,
    n.o === "data-dependent" && !n.e ? h("div", { class: "fx-node-warn", text: "⚠ Data-dependent: the forward read a tensor's value here, which a symbolic capture cannot follow." }) : null,
    h("dl", {}, rows));
}

/** What a box holds under another module's name (tied weights): "weight shared with
 * transformer.wte", each linking to the owner's node, where the box's edges for it come from. */
function sharedParams(g, link) {
  return (g.sh || []).flatMap(([attr, owner, node]) => [h("br"),
    h("span", { class: "fx-shared" }, link("n" + node, attr), ` shared with ${owner || "the model"}`)]);
}

/** Details of box c: path, class, counts, the values that cross its border, overlay values. */
export function groupDetails(model, c, go, opts = {}) {
  const g = model.groups[c];
  const kind = model.kind(c);
  const link = (key, text) => action(text, () => go(key));
  let rows;
  if (g.syn) {
    const items = model.items(c);
    rows = [...row("holds", counted(items.length, "item")), ...row("from", link(items[0], clip(model.labelOf(items[0]), 80))),
      ...row("to", link(items[items.length - 1], clip(model.labelOf(items[items.length - 1]), 80))), ...row("inside", g.path || "(model)")];
  } else if (g.io) rows = [...row(`model ${g.io}s`, h("code", { text: g.path })), ...row("values", `${grouped(g.n)} ${g.io}s from one container`)];
  else rows = [...row(kind === "module" || kind === "run" ? "module" : kind, h("code", { text: g.path })), ...(g.cls ? row("class", g.cls) : [])];
  if (g.run) rows.push(...row("folded", `${g.run} identical consecutive modules`));
  else if (g.call) rows.push(...row("call", `#${g.call + 1}`));
  if (!g.io && !g.syn) rows.push(...row("ops", grouped(g.ops)), ...row("parameters", grouped(g.params || 0), ...sharedParams(g, link)));
  if (c < model.real) rows.push(...overlayRows(opts.overlays, "groups", c));
  const { ins, outs } = c < model.real ? model.boundary(c) : { ins: [], outs: [] };
  const list = (items) => [
    h("ol", { class: "fx-io" }, items.slice(0, 16).map(([src, k]) =>
      h("li", {}, link("n" + src, model.name(src) + (k ? `[${k}]` : "")), " ", h("span", { class: "fx-shape", text: shapeText(model.meta(src, k)) })))),
    items.length > 16 ? h("span", { class: "fx-muted", text: `… +${items.length - 16}` }) : null,
  ];
  if (ins.length) rows.push(...row("inputs", ...list(ins)));
  if (outs.length) rows.push(...row("outputs", ...list(outs)));
  const kids = model.items(c).filter((k) => k[0] === "g");
  if (kids.length) {
    rows.push(...row(g.run ? "members" : "boxes", h("ul", { class: "fx-io" }, kids.slice(0, 50).map((k) => h("li", {}, link(k, clip(model.labelOf(k), 80))))),
      kids.length > 50 ? h("span", { class: "fx-muted", text: `… +${kids.length - 50}` }) : null));
  }
  const open = model.expanded.has(c);
  const hint = !model.canExpand(c) && model.items(c).length ? `Boxes nest at most ${MAX_DEPTH} deep on screen: this one stays closed. The module tree lists what is inside, and search finds it.` : open ? "Double-click the box to close it." : "Double-click the box to open it.";
  return h("div", { class: "fx-details-body", "data-key": "g" + c },
    h("h2", {}, h("i", { class: "fx-swatch fx-swatch-box", style: { borderColor: g.c } }), (g.err ? "✗ " : "") + g.l),
    model.hasError(c) ? h("div", { class: "fx-node-error", text: "✗ The failing op is inside this box." }) : null,
    h("dl", {}, rows),
    h("p", { class: "fx-muted", text: hint }));
}

/** The module tree in the sidebar: the graph's own boxes (runs folded as in the drawing), each
 * level drawn when it is first unfolded, so a 1,200-layer model costs nothing until asked. A box
 * open in the graph is unfolded in the tree (`syncTree`); the reader may fold and unfold the
 * tree apart from the graph. */
export function renderTree(el, model, go) {
  // box -> its <details>, for syncTree; `shown`: the graph's open boxes the tree last followed
  const tree = { details: new Map(), shown: new Set() };
  const fill = (details, kids) => {
    if (details.children.length === 1) details.append(h("ul", {}, kids.map(entry)));
  };
  const entry = (key) => {
    const c = +key.slice(1);
    const g = model.groups[c];
    const label = action(clip(g.l, 80), () => go(key), { class: "fx-tree-label", "data-path": g.path, "data-key": key });
    if (g.pl) label.append(h("span", { class: "fx-tree-params", text: ` ${g.pl}` }));
    const kids = model.items(c).filter((k) => k[0] === "g");
    if (!kids.length) return h("li", { class: "fx-tree-leaf" }, label);
    // the page cannot lay out thousands of nested lists: the tree goes as deep as the drawing
    if (model.depth[c] >= MAX_DEPTH) return h("li", { class: "fx-tree-leaf" }, label, h("span", { class: "fx-tree-params", text: ` ⋯ ${counted(model.height(c), "level")} deeper` }));
    const details = h("details", {}, h("summary", {}, label));
    details.fxFill = () => fill(details, kids);
    details.addEventListener("toggle", () => {
      if (details.open) details.fxFill();
    }, { once: false });
    tree.details.set(c, details);
    // made while the graph has it open (a list unfolded by syncTree): unfolded too
    if (tree.shown.has(c)) {
      details.open = true;
      details.fxFill();
    }
    return h("li", {}, details);
  };
  el.fxTree = tree;
  const top = model.items(ROOT).filter((k) => k[0] === "g");
  el.replaceChildren(h("ul", { class: "fx-tree-root" }, top.map(entry)));
  // the first level is open
  for (const d of el.querySelectorAll(":scope > ul > li > details")) d.open = true;
}

/** Make the module tree follow the graph: unfold the boxes opened since the last call (and
 * draw their lists), fold those closed. Costs the size of the open set, not of the tree. */
export function syncTree(el, model) {
  const tree = el.fxTree;
  if (!tree) return;
  const now = model.expanded;
  const was = tree.shown;
  const opened = [];
  for (const g of now) if (!was.has(g)) opened.push(g);
  const closed = [];
  for (const g of was) if (!now.has(g)) closed.push(g);
  tree.shown = new Set(now);
  for (const g of closed) {
    const d = tree.details.get(g);
    if (d) d.open = false;
  }
  // outer boxes first: unfolding one draws the entries of the boxes inside it
  opened.sort((a, b) => model.depth[a] - model.depth[b]);
  for (const g of opened) {
    const d = tree.details.get(g);
    if (!d) continue;
    d.fxFill();
    d.open = true;
  }
}

/** Open the module tree down to box c and mark it. */
export function markInTree(el, model, c) {
  for (const a of el.querySelectorAll(".fx-tree-current")) a.classList.remove("fx-tree-current");
  if (c === null) return;
  const chain = model.ancestors(c).reverse().slice(0, MAX_DEPTH);
  c = chain[chain.length - 1];
  let scope = el;
  for (const g of chain) {
    const a = scope.querySelector(`:scope > ul > li > details > summary > [data-key="g${g}"], :scope > ul > li > [data-key="g${g}"]`);
    if (!a) return;
    if (g === c) {
      a.classList.add("fx-tree-current");
      return;
    }
    const d = a.closest("details");
    if (!d) return;
    if (!d.open) {
      d.open = true;
      d.dispatchEvent(new Event("toggle"));
    }
    scope = d;
  }
}

/** The legend, in its own strip under the graph (it covers nothing): op families, or the
 * overlay's scale or categories. */
export function renderLegend(el, model, legend) {
  if (!legend) {
    const seen = new Map();
    for (let i = 0; i < model.count; i++) if (!seen.has(model.family(i))) seen.set(model.family(i), model.color(i));
    el.replaceChildren(
      h("span", { class: "fx-legend-title", text: "op kind" }),
      ...[...seen].map(([kind, color]) => h("span", { class: "fx-legend-item" }, h("i", { style: { background: color } }), kind)),
      h("span", { class: "fx-legend-item fx-legend-marks", text: "✗ raised · ⚠ data-dependent · ▶ input · ◀ output" }),
    );
    return;
  }
  if (legend.kind === "category") {
    el.replaceChildren(h("span", { class: "fx-legend-title", text: legend.label }),
      ...legend.items.map(([label, color]) => h("span", { class: "fx-legend-item", "data-category": label }, h("i", { style: { background: color } }), label)),
      h("span", { class: "fx-legend-item" }, h("i", { class: "fx-legend-none" }), "no value"));
    return;
  }
  const unit = legend.unit ? ` ${legend.unit}` : "";
  el.replaceChildren(
    h("span", { class: "fx-legend-title", text: `${legend.label} (${legend.scale})` }),
    h("span", { class: "fx-legend-lo", text: formatValue({ kind: "number", unit: legend.unit }, legend.lo) }),
    h("i", { class: "fx-legend-ramp", style: { background: `linear-gradient(to right, ${legend.stops.join(", ")})` }, title: `${legend.scale} scale${unit}` }),
    h("span", { class: "fx-legend-hi", text: formatValue({ kind: "number", unit: legend.unit }, legend.hi) }),
    h("span", { class: "fx-legend-item" }, h("i", { class: "fx-legend-none" }), "no value"));
}
