// An analysis on the page: its answer in words (the view-model's `analysis`, the sentence the
// terminal prints) above the graph, and its findings (the view-model's `panels`: pipeline stages,
// graph breaks, drifting modules) as tables in a drawer under the graph, wide enough to read,
// sortable by any column, resizable. Python made every cell's text and every row's target; this
// draws them, moves the view to the node or box a row points at when it is clicked, and lists a
// node's rows in its details.
import { h } from "./dom.js";

/** The only links a row may carry: a bare .html file name beside the report (Python checks it too). */
const SIBLING = /^[A-Za-z0-9_][A-Za-z0-9._-]{0,200}\.html$/;
const MIN_HEIGHT = 80;

/** A row's key in the graph: "n<i>", "g<i>", the page's own key for what the row stands for
 * (`key`: the diff page's "d<k>", a difference shown on both sides), or null. */
export function rowKey(r) {
  return r.n != null ? `n${r.n}` : r.g != null ? `g${r.g}` : r.key || null;
}

/** Every key a row is about: its own, and the other items whose details list it (`at`: the
 * diff page's "a:n3", "b:g2", the nodes of a difference on each side). */
export function rowKeys(r) {
  const key = rowKey(r);
  return [...(key ? [key] : []), ...(Array.isArray(r.at) ? r.at.filter((k) => typeof k === "string" && k !== key) : [])];
}

/** Where cell `j` of a row goes when clicked, when not where the row goes: the row's `ck[j]` (the
 * diff page's "d<k>:a", a difference on one side), for a cell that says something; else null. */
export function cellKey(r, j) {
  const ck = Array.isArray(r.ck) ? r.ck[j] : null;
  return typeof ck === "string" && ck && r.c && r.c[j] ? ck : null;
}

/** What column `j` of a row sorts by: Python's number, else the number the text starts with
 * ("1,234", "0.0774 ✗", "15 → 17"), else the text. */
export function sortValue(r, j) {
  const k = r.k && r.k[j];
  if (typeof k === "number") return k;
  const text = (r.c && r.c[j]) || "";
  const m = /^\s*[+-]?(\d[\d,]*\.?\d*(?:e[+-]?\d+)?|\.\d+)/i.exec(text);
  return m ? parseFloat(text.replace(/,/g, "")) : text;
}

/** Rows in column `j`'s order (`dir` 1 ascending, -1 descending): numbers before text, empty last. */
export function sortRows(rows, j, dir) {
  const keyed = rows.map((r, i) => [sortValue(r, j), i, r]);
  keyed.sort((a, b) => {
    const [x, y] = [a[0], b[0]];
    const ex = x === "", ey = y === "";
    if (ex !== ey) return ex ? 1 : -1;
    const nx = typeof x === "number", ny = typeof y === "number";
    const c = nx && ny ? x - y : nx ? -1 : ny ? 1 : String(x).localeCompare(String(y), undefined, { numeric: true });
    return c * dir || a[1] - b[1];
  });
  return keyed.map((k) => k[2]);
}

/** The analysis's answer and findings on a page. `r`: the page's refs (analysis, drawer,
 * drawerBar, findings); `go(key)` selects "n<i>" or "g<i>". */
export class Findings {
  constructor(r, data, go) {
    this.r = r;
    this.go = go;
    this.panels = (data.panels || []).filter((p) => p && Array.isArray(p.rows));
    this.analysis = data.analysis || null;
    this.byKey = new Map();
    this.tables = new Map();
    // key -> the table rows that point at it, and the rows marked as the selection's now: a
    // selection touches only its own rows and the last one's, however long the tables
    this.rowEls = new Map();
    this.marked = [];
    this.current = null;
    for (const p of this.panels) {
      for (const row of p.rows) {
        for (const key of rowKeys(row)) {
          if (!this.byKey.has(key)) this.byKey.set(key, []);
          this.byKey.get(key).push([p, row]);
        }
      }
    }
    this.timeline = data.timeline || null;
    this.renderHeadline();
    this.renderDrawer();
  }

  /** The training step's memory timeline (view-model `timeline`: live saved bytes after each
   * op, forward then backward) as a small line chart, the peak marked; a click on a point
   * selects its op. */
  chart() {
    const t = this.timeline;
    const W = 600, H = 80, n = t.b.length;
    const peak = Math.max(...t.b, 1);
    const k = t.b.indexOf(Math.max(...t.b));
    const x = (i) => (n > 1 ? (i * W) / (n - 1) : 0);
    const y = (b) => H - 4 - (b * (H - 12)) / peak;
    const NS = "http://www.w3.org/2000/svg";
    const el = (tag, attrs) => {
      const e = document.createElementNS(NS, tag);
      for (const [a, v] of Object.entries(attrs)) e.setAttribute(a, v);
      return e;
    };
    const svg = el("svg", { class: "fx-timeline", viewBox: `-4 0 ${W + 8} ${H}`, width: W + 8, height: H, role: "img",
      "aria-label": "saved activation bytes alive after each op" });
    svg.append(el("polyline", { points: t.b.map((b, i) => `${x(i)},${y(b)}`).join(" "), fill: "none", stroke: "currentColor", "stroke-width": 1.5 }));
    const dot = el("circle", { cx: x(k), cy: y(t.b[k]), r: 4, fill: "#e15759", "data-peak": t.b[k], class: "fx-timeline-peak" });
    const tip = el("title", {});
    tip.textContent = `peak: ${t.b[k].toLocaleString()} bytes after op ${k + 1} of ${n}`;
    dot.append(tip);
    dot.addEventListener("click", () => this.go(`n${t.n[k]}`));
    svg.append(dot);
    return h("div", { class: "fx-timeline-box" }, h("p", { class: "fx-muted", text: "saved bytes alive after each op (forward, then backward; the peak in red)" }), svg);
  }

  renderHeadline() {
    const el = this.r.analysis;
    if (!el) return;
    const a = this.analysis;
    el.hidden = !a;
    if (!a) return;
    const key = rowKey(a);
    const parts = [h("strong", { class: "fx-analysis-text", "data-ref": "headline", text: a.text })];
    const panel = this.panels.find((p) => p.name === a.p);
    if (panel) {
      parts.push(h("button", { type: "button", class: "fx-analysis-facts", "data-panel": panel.name,
        title: "Open the table behind this answer", onclick: () => this.open(panel.name), text: `${panel.title || panel.name} ▾` }));
    }
    if (key) parts.push(h("button", { type: "button", class: "fx-analysis-go", title: "Select it in the graph", onclick: () => this.go(key), text: "show in graph" }));
    // the notes the terminal prints under the answer ("note: ..."), each whole
    if (a.nt && a.nt.length) parts.push(h("ul", { class: "fx-analysis-notes" }, a.nt.map((t) => h("li", { text: t }))));
    el.className = `fx-analysis${a.lv ? ` fx-analysis-${a.lv}` : ""}`;
    el.replaceChildren(...parts);
  }

  renderDrawer() {
    const { drawer, drawerBar, findings } = this.r;
    if (!drawer || !findings) return;
    drawer.hidden = !this.panels.length;
    if (!this.panels.length) return;
    const tabs = this.panels.map((p) => h("button", { type: "button", class: "fx-drawer-tab", "data-panel": p.name,
      "aria-pressed": "false", title: p.note || p.title || p.name, onclick: () => this.toggle(p.name),
      text: `${p.title || p.name} (${p.rows.length})` }));
    const handle = h("div", { class: "fx-drawer-handle", title: "Drag to resize the table", "aria-hidden": "true" });
    const close = h("button", { type: "button", class: "fx-drawer-close", title: "Hide the table", onclick: () => this.close(), text: "▾ hide" });
    drawerBar.replaceChildren(handle, h("span", { class: "fx-drawer-title", text: "findings" }), ...tabs, close);
    this.bindResize(handle);
    findings.replaceChildren(...this.panels.map((p) => this.section(p)));
    this.close();
  }

  /** One panel's section: title, table (click a header to sort), note. */
  section(p) {
    const sort = { j: -1, dir: 1 };
    const ths = p.columns.map((c, j) => {
      const th = h("th", { scope: "col", "aria-sort": "none", title: "Sort by this column", text: c });
      th.addEventListener("click", () => {
        sort.dir = sort.j === j ? -sort.dir : 1;
        sort.j = j;
        for (const o of ths) o.setAttribute("aria-sort", "none");
        th.setAttribute("aria-sort", sort.dir > 0 ? "ascending" : "descending");
        tbody.replaceChildren(...sortRows(p.rows, j, sort.dir).map((r) => trs.get(r)));
      });
      return th;
    });
    const trs = new Map(p.rows.map((r) => [r, this.rowEl(r)]));
    const tbody = h("tbody", {}, ...trs.values());
    this.tables.set(p.name, tbody);
    return h("section", { class: "fx-panel", "data-panel": p.name, hidden: true },
      h("h2", { text: p.title || p.name }),
      h("div", { class: "fx-panel-scroll" },
        h("table", { class: "fx-panel-table" }, h("thead", {}, h("tr", {}, ...ths)), tbody)),
      ...(p.note ? [h("p", { class: "fx-muted fx-panel-note", text: p.note })] : []),
      ...(p.name === "saved" && this.timeline ? [this.chart()] : []));
  }

  rowEl(r) {
    const key = rowKey(r);
    const cells = r.c.map((c, j) => {
      // a cell with a target of its own goes there; the rest of the row goes to the row's
      const ck = cellKey(r, j);
      if (!ck) return h("td", { text: c });
      const link = h("a", { href: "#", class: "fx-cell-link", "data-key": ck, title: "Show it on this side", text: c });
      link.addEventListener("click", (e) => {
        e.preventDefault();
        e.stopPropagation();
        this.go(ck);
      });
      return h("td", {}, link);
    });
    if (r.h && SIBLING.test(r.h) && cells.length) { // another page beside this one: a stage of a pipeline
      const first = cells[0];
      first.replaceChildren(h("a", { href: r.h, class: "fx-panel-link", title: `Open ${r.h}`, text: first.textContent }));
    }
    const tr = h("tr", { class: `fx-finding${r.lv ? ` fx-lv-${r.lv}` : ""}${key ? " fx-linked" : ""}` }, ...cells);
    for (const k of rowKeys(r)) {
      if (!this.rowEls.has(k)) this.rowEls.set(k, []);
      this.rowEls.get(k).push(tr);
    }
    if (key) {
      tr.tabIndex = 0;
      tr.title = r.detail ? `Show it in the graph\n\n${r.detail.slice(0, 600)}` : "Show it in the graph";
      tr.dataset.key = key;
      tr.addEventListener("click", (e) => {
        if (e.target.closest && e.target.closest("a")) return;
        this.go(key);
      });
      tr.addEventListener("keydown", (e) => {
        // Enter on a link in the row (a cell's own target, a sibling page) follows the link
        if (e.key !== "Enter" || (e.target.closest && e.target.closest("a"))) return;
        e.preventDefault();
        e.stopPropagation();
        this.go(key);
      });
    }
    return tr;
  }

  /** Show panel `name` in the drawer (opening it). */
  open(name) {
    const { drawer, findings } = this.r;
    if (!drawer || !this.tables.has(name)) return;
    this.current = name;
    drawer.classList.add("fx-drawer-open");
    for (const s of findings.children) s.hidden = s.dataset.panel !== name;
    for (const t of this.r.drawerBar.querySelectorAll(".fx-drawer-tab")) t.setAttribute("aria-pressed", String(t.dataset.panel === name));
    findings.hidden = false;
  }

  close() {
    const { drawer, findings } = this.r;
    if (!drawer) return;
    this.current = null;
    drawer.classList.remove("fx-drawer-open");
    findings.hidden = true;
    for (const t of this.r.drawerBar.querySelectorAll(".fx-drawer-tab")) t.setAttribute("aria-pressed", "false");
  }

  toggle(name) {
    if (this.current === name) this.close();
    else this.open(name);
  }

  bindResize(handle) {
    const body = this.r.findings;
    handle.addEventListener("pointerdown", (e) => {
      if (!this.current) this.open(this.panels[0].name);
      const y0 = e.clientY;
      const h0 = body.getBoundingClientRect().height;
      const center = this.r.drawer.parentElement.getBoundingClientRect().height;
      handle.setPointerCapture(e.pointerId);
      const move = (ev) => {
        const height = Math.max(MIN_HEIGHT, Math.min(center - 120, h0 + y0 - ev.clientY));
        body.style.height = `${Math.round(height)}px`;
        body.style.maxHeight = "none";
      };
      const up = () => {
        handle.removeEventListener("pointermove", move);
        handle.removeEventListener("pointerup", up);
      };
      handle.addEventListener("pointermove", move);
      handle.addEventListener("pointerup", up);
      e.preventDefault();
    });
  }

  /** Mark the rows that point at `key` (the graph's selection). */
  mark(key) {
    for (const tr of this.marked) tr.classList.remove("fx-finding-current");
    this.marked = (key && this.rowEls.get(key)) || [];
    for (const tr of this.marked) tr.classList.add("fx-finding-current");
  }

  /** The findings about `key` for its details panel: each row that points at it, as
   * "column: cell" under its panel's title; null when none does. */
  facts(key) {
    const found = this.byKey.get(key);
    if (!found) return null;
    return h("section", { class: "fx-facts" }, ...found.map(([p, r]) => h("div", { class: `fx-fact${r.lv ? ` fx-lv-${r.lv}` : ""}`, "data-panel": p.name },
      h("h3", {}, h("a", { href: "#", title: "Open the table", onclick: (e) => { e.preventDefault(); this.open(p.name); }, text: p.title || p.name })),
      h("dl", { class: "fx-attrs" }, ...p.columns.flatMap((c, j) => (r.c[j] ? [h("dt", { text: c }), h("dd", { text: r.c[j] })] : []))),
      // the row's long explanation (a failed capture's exception), which no cell could hold
      ...(r.detail ? [h("details", { class: "fx-fact-detail" }, h("summary", { text: "detail" }), h("pre", { text: r.detail }))] : []))));
  }
}
