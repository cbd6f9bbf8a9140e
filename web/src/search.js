// Search over node names, ops and module paths, with filters (`op:`, `module:`, `kind:`), regular
// expressions (`/…/` or the .* switch), a count of every match, results grouped by module, and
// Enter / Shift+Enter stepping through all of them. The index is built on first use.
import { h } from "./dom.js";
import { clip, grouped } from "./text.js";

const FILTERS = { op: "op", o: "op", module: "module", m: "module", kind: "kind", k: "kind" };
/** Rows drawn in the result list at once; the count and stepping cover every match. */
export const SHOWN = 300;

/** `{ text, filters: {op, module, kind}, regex }` of a query; `regex` when the query is /…/ or
 * the switch is on. Filters take the rest of their word: `op:linear module:h.1`. */
export function parseQuery(query, regexSwitch = false) {
  const out = { text: "", filters: {}, regex: regexSwitch };
  const words = [];
  for (const w of query.trim().split(/\s+/)) {
    const m = /^([a-z]+):(.+)$/.exec(w);
    if (m && FILTERS[m[1]]) out.filters[FILTERS[m[1]]] = m[2];
    else if (w) words.push(w);
  }
  let text = words.join(" ");
  const slash = /^\/(.+)\/([a-z]*)$/.exec(text);
  if (slash) {
    out.regex = true;
    text = slash[1];
  }
  out.text = text;
  return out;
}

/** A test of one string against a query part: regex (case-insensitive) or substring. Throws
 * SyntaxError on a bad regex. */
function matcher(pattern, regex) {
  if (regex) {
    const re = new RegExp(pattern, "i");
    return (w) => re.test(w);
  }
  const p = pattern.toLowerCase();
  return (w) => w.toLowerCase().includes(p);
}

export class Search {
  constructor(model) {
    this.model = model;
    this.entries = null;
  }

  index() {
    if (this.entries) return this.entries;
    const m = this.model;
    const out = [];
    for (let i = 0; i < m.count; i++) {
      const n = m.node(i);
      const g = m.moduleOf(i);
      const path = g >= 0 ? m.groups[g].path : "";
      out.push({ key: "n" + i, order: i, title: n.l, sub: n.n, module: path, color: m.color(i), box: false,
        words: [n.n, n.l, n.t, path], op: n.k === "op" ? [n.t, n.l, n.o] : [], kinds: [n.k, n.o] });
    }
    for (let c = 0; c < m.real; c++) {
      const g = m.groups[c];
      const first = m.items(c).length ? m.items(c)[0] : null;
      out.push({ key: "g" + c, order: first && first[0] === "n" ? +first.slice(1) : -1, title: g.l, sub: boxWhere(m, c), module: m.groups[c].p >= 0 ? m.groups[m.groups[c].p].path : "",
        color: g.c, box: true, words: [g.path, g.l, g.cls || ""], op: [], kinds: [m.kind(c)] });
    }
    this.entries = out;
    return out;
  }

  /** Every match of `query`, best first: `{ hits, error }` (error: a bad regex, in words). */
  find(query, regexSwitch = false) {
    const q = parseQuery(query, regexSwitch);
    if (!q.text && !Object.keys(q.filters).length) return { hits: [], error: null };
    let text;
    let op;
    let mod;
    let kind;
    try {
      text = q.text ? matcher(q.text, q.regex) : null;
      op = q.filters.op ? matcher(q.filters.op, q.regex) : null;
      mod = q.filters.module ? matcher(q.filters.module, q.regex) : null;
      kind = q.filters.kind ? (w) => w.toLowerCase() === q.filters.kind.toLowerCase() : null;
    } catch (err) {
      return { hits: [], error: `not a regular expression: ${err.message}` };
    }
    const low = q.text.toLowerCase();
    const hits = [];
    for (const e of this.index()) {
      if (op && !e.op.some(op)) continue;
      if (mod && !mod(e.module) && !(e.box && e.words.some(mod))) continue;
      if (kind && !e.kinds.some(kind)) continue;
      let score = 1;
      if (text) {
        if (!e.words.some(text)) continue;
        if (!q.regex) score = e.words.some((w) => w.toLowerCase() === low) ? 3 : e.words.some((w) => w.toLowerCase().startsWith(low)) ? 2 : 1;
      }
      hits.push({ score, e });
    }
    hits.sort((a, b) => b.score - a.score || Number(b.e.box) - Number(a.e.box) || a.e.order - b.e.order);
    return { hits: groupByModule(hits.map((x) => x.e)), error: null };
  }
}

/** Where box c is, for its row among the hits: the module path (`transformer.h.3.attn.c_attn`),
 * which tells apart the boxes of repeated layers that share a label, with the call's number
 * for a module called more than once, and the kind for a box that is not a module's own. */
export function boxWhere(m, c) {
  const g = m.groups[c];
  const kind = m.kind(c);
  const where = (g.path || "(model)") + (g.call ? ` #${g.call + 1}` : "");
  return kind === "module" || kind === "run" ? where : `${kind} in ${where}`;
}

/** Hits reordered so that those of one module are together, modules in order of their best hit. */
export function groupByModule(hits) {
  const groups = new Map();
  for (const e of hits) {
    const k = e.box ? "\u0000boxes" : e.module;
    (groups.get(k) || groups.set(k, []).get(k)).push(e);
  }
  return [...groups.values()].flat();
}

/** Wire the search box: typing lists hits with their count, grouped by module; arrows move in
 * the list; Enter goes to the next hit (Shift+Enter the previous), through all of them. Enter
 * or a click on a hit closes the list, so that the graph is in sight (the count still says
 * which hit of how many; an arrow or typing opens the list again). */
export function bindSearch(ui, search, go, onQuery = () => {}) {
  const { input, list, count, regex } = ui;
  let hits = [];
  let active = -1;
  let timer = null;
  let pending = false;
  const row = (e, j) => h("li", { class: j === active ? "fx-active" : "", "data-key": e.key, onmousedown: (ev) => { ev.preventDefault(); pick(j); list.hidden = true; } },
    h("i", { class: e.box ? "fx-swatch fx-swatch-box" : "fx-swatch", style: e.box ? { borderColor: e.color } : { background: e.color } }),
    h("span", { class: "fx-result-title", text: clip(e.title, 80) }), h("span", { class: "fx-result-sub", text: clip(e.sub, 120) }));
  const show = (error) => {
    const rows = [];
    let last = null;
    hits.slice(0, SHOWN).forEach((e, j) => {
      const head = e.box ? "modules" : e.module || "(model)";
      if (head !== last) rows.push(h("li", { class: "fx-result-group", text: clip(head, 100) }));
      last = head;
      rows.push(row(e, j));
    });
    if (hits.length > SHOWN) rows.push(h("li", { class: "fx-none", text: `… ${grouped(hits.length - SHOWN)} more: Enter steps through all ${grouped(hits.length)}` }));
    if (error) rows.push(h("li", { class: "fx-none fx-search-error", text: error }));
    else if (!hits.length && input.value.trim()) rows.push(h("li", { class: "fx-none", text: "no match" }));
    list.replaceChildren(...rows);
    list.hidden = !input.value.trim();
    count.textContent = input.value.trim() ? (hits.length ? `${active >= 0 ? grouped(active + 1) + " / " : ""}${grouped(hits.length)}` : "0") : "";
  };
  const pick = (j) => {
    if (!hits[j]) return;
    active = j;
    show();
    go(hits[j].key);
  };
  const run = () => {
    clearTimeout(timer);
    pending = false;
    const { hits: found, error } = search.find(input.value, regex.getAttribute("aria-pressed") === "true");
    hits = found;
    active = -1;
    show(error);
    onQuery(input.value);
  };
  input.addEventListener("input", () => {
    clearTimeout(timer);
    pending = true;
    timer = setTimeout(run, 60);
  });
  regex.addEventListener("click", () => {
    regex.setAttribute("aria-pressed", regex.getAttribute("aria-pressed") === "true" ? "false" : "true");
    run();
  });
  input.addEventListener("keydown", (ev) => {
    if (ev.key === "ArrowDown") { active = Math.min(active + 1, Math.min(hits.length, SHOWN) - 1); show(); ev.preventDefault(); }
    else if (ev.key === "ArrowUp") { active = Math.max(active - 1, 0); show(); ev.preventDefault(); }
    else if (ev.key === "Enter") {
      if (pending) run();
      if (hits.length) {
        pick(ev.shiftKey ? (active <= 0 ? hits.length - 1 : active - 1) : (active + 1) % hits.length);
        list.hidden = true;
      }
      ev.preventDefault();
    } else if (ev.key === "Escape") { list.hidden = true; input.blur(); }
  });
  input.addEventListener("blur", () => setTimeout(() => (list.hidden = true), 150));
  input.addEventListener("focus", () => { if (input.value.trim()) show(); });
  return { set: (q) => { input.value = q; run(); }, run };
}
