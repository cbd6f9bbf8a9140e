// Search over node names, ops and module paths. The index is built once; a query ranks exact
// matches over prefixes over substrings, nodes and boxes together.
import { h } from "./dom.js";

const LIMIT = 30;

export class Search {
  constructor(model) {
    this.entries = [];
    model.nodes.forEach((n, i) => {
      const path = n.g >= 0 ? model.groups[n.g].path : "";
      this.entries.push({ key: "n" + i, title: n.l, sub: path ? `${n.n} · ${path}` : n.n, color: n.c, words: [n.n, n.l, n.t || "", path].map((w) => w.toLowerCase()) });
    });
    model.groups.forEach((g, c) => {
      this.entries.push({ key: "g" + c, title: g.l, sub: g.path + (g.cls ? ` (${g.cls})` : ""), color: g.c, box: true, words: [g.path, g.l, g.cls].map((w) => w.toLowerCase()) });
    });
  }

  find(query) {
    const q = query.trim().toLowerCase();
    if (!q) return [];
    const hits = [];
    for (const e of this.entries) {
      let best = 0;
      for (const w of e.words) {
        if (w === q) best = Math.max(best, 3);
        else if (w.startsWith(q)) best = Math.max(best, 2);
        else if (w.includes(q)) best = Math.max(best, 1);
      }
      if (best) hits.push([best, e]);
    }
    hits.sort((a, b) => b[0] - a[0]);
    return hits.slice(0, LIMIT).map((x) => x[1]);
  }
}

/** Wire the search box: typing lists hits, arrows move, Enter or click jumps to one. */
export function bindSearch(input, list, search, go) {
  let hits = [];
  let active = 0;
  const show = () => {
    list.replaceChildren(
      ...hits.map((e, j) =>
        h("li", { class: j === active ? "fx-active" : "", "data-key": e.key, onmousedown: (ev) => { ev.preventDefault(); pick(j); } },
          h("i", { class: e.box ? "fx-swatch fx-swatch-box" : "fx-swatch", style: e.box ? { borderColor: e.color } : { background: e.color } }),
          h("span", { class: "fx-result-title", text: e.title }), h("span", { class: "fx-result-sub", text: e.sub }))),
    );
    if (!hits.length && input.value.trim()) list.replaceChildren(h("li", { class: "fx-none", text: "no match" }));
    list.hidden = !input.value.trim();
  };
  const pick = (j) => {
    if (!hits[j]) return;
    list.hidden = true;
    go(hits[j].key);
  };
  input.addEventListener("input", () => {
    hits = search.find(input.value);
    active = 0;
    show();
  });
  input.addEventListener("keydown", (ev) => {
    if (ev.key === "ArrowDown") { active = Math.min(active + 1, hits.length - 1); show(); ev.preventDefault(); }
    else if (ev.key === "ArrowUp") { active = Math.max(active - 1, 0); show(); ev.preventDefault(); }
    else if (ev.key === "Enter") { pick(active); ev.preventDefault(); }
    else if (ev.key === "Escape") { list.hidden = true; input.blur(); }
  });
  input.addEventListener("blur", () => setTimeout(() => (list.hidden = true), 150));
  input.addEventListener("focus", () => { if (input.value.trim()) show(); });
}
