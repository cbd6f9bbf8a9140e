"""Panels (:mod:`fxviz.passes.panels`) as renderers show them: rich tables under the tree, and the
view-model's ``panels`` with rows pointing at node and box indices. No torch."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from rich.table import Table
from rich.text import Text

from fxviz.ir import Graph
from fxviz.passes.panels import headline, panels
from fxviz.passes.training import saved_panel, saved_summary
from fxviz.render.view import bounded
from fxviz.text import ANSWER_CHARS, NOTE_CHARS

#: How a row's level reads in the terminal (red is for errors only, as everywhere).
LEVEL_STYLES = {"error": "red", "warn": "yellow", "ok": "green", "info": "dim"}


def cell_text(v: Any) -> str:
    """A cell as text: numbers short (``0.00031``, ``12.5``, ``1,234``), text bounded."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:,.0f}" if v.is_integer() and abs(v) < 1e15 else f"{v:.3g}"
    return bounded(str(v), 200)


def panel_tables(graph: Graph) -> list[Table | Text]:
    """One rich table per panel, in the order they were written; a panel without rows is its title
    and note on one line (an empty table's frame says nothing); a panel with ``page`` prints that
    many rows and says how many more there are. A note is printed whole (a stages panel's holds
    every record torch made of its passes), wrapped under the table."""
    out: list[Table | Text] = []
    for spec in panels(graph).values():
        if not spec.get("rows"):
            out.append(Text.assemble((bounded(str(spec.get("title", "")), 120), "bold"), ": ",
                                     str(spec.get("note", "")) or "nothing to show"))
            continue
        rows = spec.get("rows", [])
        page = spec.get("page")
        note = str(spec.get("note", ""))  # whole: it is the panel's answer (rich wraps the caption)
        if isinstance(page, int) and not isinstance(page, bool) and 0 < page < len(rows):
            note = f"{note}{'; ' if note else ''}... {len(rows) - page} more rows (the report and the JSON list all)"
            rows = rows[:page]
        table = Table(title=Text(bounded(str(spec.get("title", "")), 120), style="bold"),
                      caption=note or None, title_justify="left", caption_justify="left", expand=False)
        for j, c in enumerate(spec.get("columns", [])):
            values = [r["cells"][j] for r in rows if r.get("cells") and r["cells"][j] is not None]
            numbers = bool(values) and all(isinstance(v, int | float) for v in values)
            table.add_column(bounded(str(c), 60), overflow="fold", justify="right" if numbers else "left")
        for r in rows:
            table.add_row(*(Text(cell_text(v)) for v in r.get("cells", [])),
                          style=LEVEL_STYLES.get(r.get("level") or "", ""))
        out.append(table)
    return out


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def panel_view(graph: Graph, nindex: Mapping[str, int], gindex: Mapping[str, int]) -> list[dict[str, Any]]:
    """The view-model's ``panels``: each ``{"name", "title", "note", "columns", "rows": [{"c":
    cells as text, "k": the numbers among them (null for text; absent when none), for sorting, "n": node index, "g": box index, "lv": level, "h": a sibling page}]}``; a row's node or module that
    the graph does not have is dropped from the row, not an error (a panel outlives a refold)."""
    out = []
    specs = panels(graph)
    derived = saved_panel(graph)  # the training step's saved activations, from Graph.saved
    if derived is not None and "saved" not in specs:
        specs["saved"] = derived
    for name, spec in specs.items():
        rows = []
        for r in spec.get("rows", []):
            cells = r.get("cells", [])
            entry: dict[str, Any] = {"c": [cell_text(v) for v in cells]}
            keys = r.get("sort") or [None] * len(cells)  # what to sort by: the row's own keys, else its numbers
            keys = [k if _number(k) else v if _number(v) else None for k, v in zip(keys, cells, strict=False)]
            if any(k is not None for k in keys):
                entry["k"] = keys
            if r.get("node") in nindex:
                entry["n"] = nindex[r["node"]]
            if r.get("module") in gindex:
                entry["g"] = gindex[r["module"]]
            if r.get("level"):
                entry["lv"] = r["level"]
            if r.get("href"):
                entry["h"] = r["href"]
            rows.append(entry)
        out.append({"name": name, "title": bounded(str(spec.get("title", "")), 120),
                    "note": str(spec.get("note", "")),  # whole, as the terminal prints it; the page wraps it
                    "columns": [bounded(str(c), 60) for c in spec.get("columns", [])], "rows": rows})
    return out


def headline_view(graph: Graph, nindex: Mapping[str, int], gindex: Mapping[str, int]) -> dict[str, Any] | None:
    """The view-model's ``analysis``: the analysis's answer (:func:`fxviz.passes.panels.headline`,
    the very text the terminal prints) as ``{"text", "nt": its notes, "lv": level, "p": the panel with the facts
    behind it, "n": node index, "g": box index}``; ``None`` for a graph no analysis wrote on."""
    text = headline(graph)
    spec = graph.annotations.get("headline")
    if not text and graph.saved:  # a training step: its saved activations, the table behind them
        return {"text": bounded(saved_summary(graph), ANSWER_CHARS), "p": "saved"}
    if not text or not isinstance(spec, dict):
        return None
    out: dict[str, Any] = {"text": bounded(text, ANSWER_CHARS)}
    if spec.get("notes"):  # what the terminal prints under the answer (``note: ...``), each whole
        out["nt"] = [bounded(str(note), NOTE_CHARS) for note in spec["notes"]]
    if spec.get("level"):
        out["lv"] = spec["level"]
    if spec.get("panel") in panels(graph):
        out["p"] = spec["panel"]
    if spec.get("node") in nindex:
        out["n"] = nindex[spec["node"]]
    if spec.get("module") in gindex:
        out["g"] = gindex[spec["module"]]
    return out


__all__ = ["LEVEL_STYLES", "cell_text", "headline_view", "panel_tables", "panel_view"]
