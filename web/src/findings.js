// An analysis's findings (the view-model's `panels`: pipeline stages, graph breaks, drifting
// modules) as tables in the sidebar. Python made every cell's text and every row's target; this
// only draws them and moves the view to the node or box a row points at when it is clicked.
import { h } from "./dom.js";

/** The only links a row may carry: a bare .html file name beside the report (Python checks it too). */
const SIBLING = /^[A-Za-z0-9_][A-Za-z0-9._-]{0,200}\.html$/;

/** Draw `panels` into `el`; `go(key)` selects "n<i>" or "g<i>". Returns how many were drawn. */
export function renderFindings(el, panels, go) {
  el.replaceChildren();
  for (const p of panels || []) {
    const head = h("tr", {}, ...p.columns.map((c) => h("th", { scope: "col", text: c })));
    const body = p.rows.map((r) => {
      const key = r.n != null ? `n${r.n}` : r.g != null ? `g${r.g}` : null;
      const cells = r.c.map((c) => h("td", { text: c }));
      if (r.h && SIBLING.test(r.h) && cells.length) {  // another page beside this one: a stage of a pipeline
        const first = cells[0];
        first.replaceChildren(h("a", { href: r.h, class: "fx-panel-link", title: `Open ${r.h}`, text: first.textContent }));
      }
      const tr = h("tr", { class: `fx-finding${r.lv ? ` fx-lv-${r.lv}` : ""}${key ? " fx-linked" : ""}` }, ...cells);
      if (key) {
        tr.tabIndex = 0;
        tr.title = "Show it in the graph";
        tr.dataset.key = key;
        tr.addEventListener("click", () => go(key));
        tr.addEventListener("keydown", (e) => { if (e.key === "Enter") go(key); });
      }
      return tr;
    });
    el.append(h("section", { class: "fx-panel", "data-panel": p.name },
      h("h2", { text: p.title || p.name }),
      h("div", { class: "fx-panel-scroll" },
        h("table", { class: "fx-panel-table" }, h("thead", {}, head), h("tbody", {}, ...body))),
      ...(p.note ? [h("p", { class: "fx-muted fx-panel-note", text: p.note })] : [])));
  }
  el.hidden = !(panels && panels.length);
  return (panels || []).length;
}
