// The panels around the graph: capture banners, details of the selection, module tree, legend.
import { grouped, h } from "./dom.js";

/** Header text and the banners: capture method, failed attempts, partial graph. */
export function renderHeader(r, data, onShowError) {
  r.model.textContent = data.name || "model";
  const fell = data.attempts.filter((a) => !a.ok);
  r.method.textContent = data.method || "unknown method";
  r.method.classList.toggle("fx-fallback", fell.length > 0);
  r.method.title = "capture method that produced this graph";
  const t = data.totals;
  r.totals.textContent = `${grouped(t.ops)} ops · ${t.pl || 0} params · ${grouped(t.nodes)} nodes`;

  const banners = [];
  if (data.error) {
    banners.push(
      h("div", { class: "fx-banner fx-banner-error", role: "alert" },
        h("strong", { text: "Partial graph. " }),
        "The model raised during capture; the graph stops at the failing op, marked in red: ",
        h("code", { text: data.error }), " ",
        h("button", { type: "button", onclick: onShowError, text: "Show failing node" })),
    );
  }
  if (fell.length) {
    banners.push(
      h("div", { class: "fx-banner fx-banner-warn" },
        h("strong", { text: `Captured with ${data.method || "?"}` }),
        ` after ${fell.length} failed attempt${fell.length > 1 ? "s" : ""}:`,
        h("ul", {}, fell.map((a) => h("li", { title: a.message }, h("code", { text: a.method }), ": ", a.reason)))),
    );
  }
  r.banners.replaceChildren(...banners);
}

export function renderLegend(el, model) {
  const seen = new Map();
  for (const n of model.nodes) if (!seen.has(n.o)) seen.set(n.o, n.c);
  el.replaceChildren(
    ...[...seen].map(([kind, color]) => h("span", { class: "fx-legend-item" }, h("i", { style: { background: color } }), kind)),
  );
}

function row(label, ...value) {
  return [h("dt", { text: label }), h("dd", {}, ...value)];
}

function shapeText(m) {
  return m ? `${m[0]} ${m[1]}` : "unknown";
}

/** Details of node i. `go(key)` reveals and selects another node or box. */
export function nodeDetails(model, i, go) {
  const n = model.nodes[i];
  const g = n.g >= 0 ? model.groups[n.g] : null;
  const rows = [
    ...row("name", h("code", { text: n.n })),
    ...row("kind", n.k === "op" ? `op (${n.o})` : n.k),
  ];
  if (n.t) rows.push(...row(n.k === "op" ? "op" : "target", h("code", { text: n.t })));
  rows.push(...row("module", g ? h("a", { href: "#", onclick: (e) => { e.preventDefault(); go("g" + n.g); }, text: g.path }) : "(model)", g && g.cls ? ` (${g.cls})` : ""));
  const ins = model.inputs(i);
  if (ins.length) {
    rows.push(...row("inputs", h("ol", { class: "fx-io" }, ins.map(([src, k]) =>
      h("li", {}, h("a", { href: "#", onclick: (e) => { e.preventDefault(); go("n" + src); }, text: model.nodes[src].n + (k ? `[${k}]` : "") }),
        " ", h("span", { class: "fx-shape", text: shapeText(model.meta(src, k)) }))))));
  }
  if (n.out && n.out.length) {
    rows.push(...row("outputs", h("ol", { class: "fx-io" }, n.out.map((_, k) => h("li", {}, h("span", { class: "fx-shape", text: shapeText(model.meta(i, k)) }))))));
  }
  const users = model.users(i);
  if (users.length) {
    rows.push(...row("used by", h("span", {}, ...users.slice(0, 12).flatMap((u, j) => [j ? ", " : "", h("a", { href: "#", onclick: (e) => { e.preventDefault(); go("n" + u); }, text: model.nodes[u].n })]), users.length > 12 ? ` … +${users.length - 12}` : "")));
  }
  if (n.np) rows.push(...row("parameters", grouped(n.np)));
  if (n.s !== undefined) {
    const [file, line, func, code] = model.sources[n.s];
    rows.push(...row("source", h("code", { class: "fx-src", title: file, text: `${file.split("/").pop()}:${line}${func ? ` in ${func}` : ""}` }), code ? h("pre", { text: code }) : null));
  }
  if (n.a && Object.keys(n.a).length) {
    rows.push(...row("attributes", h("dl", { class: "fx-attrs" }, Object.entries(n.a).flatMap(([k, v]) => [h("dt", { text: k }), h("dd", { text: typeof v === "string" ? v : JSON.stringify(v) })]))));
  }
  return h("div", { class: "fx-details-body", "data-key": "n" + i },
    h("h2", {}, h("i", { class: "fx-swatch", style: { background: n.c } }), n.l),
    n.e ? h("div", { class: "fx-node-error", role: "alert" }, h("strong", { text: "This op raised: " }), n.e) : null,
    h("dl", {}, rows));
}

/** Details of box g: path, class, counts, and the values that cross its border. */
export function groupDetails(model, c, go) {
  const g = model.groups[c];
  const rows = g.io
    ? [...row(`model ${g.io}s`, h("code", { text: g.path })), ...row("values", `${grouped(g.n)} ${g.io}s from one container`)]
    : [...row("module", h("code", { text: g.path })), ...row("class", g.cls || "?")];
  if (g.run) rows.push(...row("folded", `${g.run} identical consecutive modules`));
  else if (g.call) rows.push(...row("call", `#${g.call + 1}`));
  if (!g.io) rows.push(...row("ops", grouped(g.ops)), ...row("parameters", grouped(g.params)));
  const { ins, outs } = model.boundary(c);
  const list = (items) => [
    h("ol", { class: "fx-io" }, items.slice(0, 16).map(([src, k]) =>
      h("li", {}, h("a", { href: "#", onclick: (e) => { e.preventDefault(); go("n" + src); }, text: model.nodes[src].n + (k ? `[${k}]` : "") }), " ", h("span", { class: "fx-shape", text: shapeText(model.meta(src, k)) })))),
    items.length > 16 ? h("span", { class: "fx-muted", text: `… +${items.length - 16}` }) : null,
  ];
  if (ins.length) rows.push(...row("inputs", ...list(ins)));
  if (outs.length) rows.push(...row("outputs", ...list(outs)));
  const kids = model.childGroups[c];
  if (kids.length) {
    rows.push(...row(g.run ? "members" : "submodules", h("ul", { class: "fx-io" }, kids.slice(0, 50).map((k) => h("li", {}, h("a", { href: "#", onclick: (e) => { e.preventDefault(); go("g" + k); }, text: model.groups[k].l }))))));
  }
  return h("div", { class: "fx-details-body", "data-key": "g" + c },
    h("h2", {}, h("i", { class: "fx-swatch fx-swatch-box", style: { borderColor: g.c } }), g.l),
    model.hasError(c) ? h("div", { class: "fx-node-error", text: "The failing op is inside this module." }) : null,
    h("dl", {}, rows),
    h("p", { class: "fx-muted", text: model.expanded.has(c) ? "Double-click the box to collapse it." : "Double-click the box to expand it." }));
}

/** The module tree in the sidebar, mirroring the terminal tree. `go(path)` reveals a module. */
export function renderTree(el, data, go) {
  const item = (t, depth) => {
    const label = h("a", { href: "#", class: "fx-tree-label", "data-path": t.path, onclick: (e) => { e.preventDefault(); go(t.path); } },
      t.label, t.pl ? h("span", { class: "fx-tree-params", text: ` ${t.pl}` }) : null);
    if (!t.c.length) return h("li", { class: "fx-tree-leaf" }, label);
    return h("li", {}, h("details", { open: depth < 1 }, h("summary", {}, label), h("ul", {}, t.c.map((c) => item(c, depth + 1)))));
  };
  el.replaceChildren(h("ul", { class: "fx-tree-root" }, item(data.tree, 0)));
}
