"""Panels: an analysis's findings as a table whose rows point into the graph. No torch.

An overlay colours every node with a value; a panel lists what an analyzer wants read first: the
stages of a pass pipeline, the graph breaks of a torch.compile run, the modules where the numbers
drift most. It is plain JSON under ``graph.annotations["panels"][name]``::

    {"title": "graph breaks", "columns": ["line", "reason", "count"],
     "rows": [{"cells": ["model.py:12", "Tensor.item()", 3], "node": "item", "module": "head#0",
               "level": "error"}],
     "note": "3 breaks, 1 cause"}

A panel may set ``page`` (a number of rows): the tree prints that many and says how many more
there are; the report and JSON keep every row. A row may point at a node (by name) and a module call (by :attr:`fxviz.calls.Call.id`): the report
selects it when the row is clicked; ``level`` (``error``, ``warn``, ``ok``, ``info``) colours it.
An analysis also states its answer in words, once (:func:`set_headline`): the sentence the
terminal prints first is the one the report opens with and JSON keeps, under
``graph.annotations["headline"]``, with the panel that holds the facts behind it.

Every renderer draws every panel (the tree prints them under the tree, the report lists them in
its sidebar, JSON keeps them), so an analyzer that writes one needs no renderer change.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from fxviz.ir import Graph
from fxviz.schema.annotations import check_headline, check_panel


def row(*cells: Any, node: str | None = None, module: str | None = None, level: str | None = None,
        href: str | None = None, sort: Sequence[float | None] | None = None) -> dict[str, Any]:
    """One row: its cells, what it points at, and a page beside the report it links to (``href``, a
    bare ``.html`` file name: a pipeline's other stages); ``sort``, one number (or ``None``) per cell
    that the report sorts a column by where a cell is text made of a number (``"50.5 ms"``)."""
    out: dict[str, Any] = {"cells": list(cells)}
    if sort is not None:
        out["sort"] = list(sort)
    if node is not None:
        out["node"] = node
    if module is not None:
        out["module"] = module
    if level is not None:
        out["level"] = level
    if href is not None:
        out["href"] = href
    return out


def set_panel(graph: Graph, name: str, *, title: str, columns: Sequence[str],
              rows: Iterable[Mapping[str, Any]], note: str = "") -> dict[str, Any]:
    """Write panel ``name`` on ``graph`` (replacing one of that name) and return it; checked as a
    saved graph's are (a bad cell is a :class:`~fxviz.errors.GraphFormatError` here, not when the
    graph is read)."""
    spec: dict[str, Any] = {"title": title, "columns": list(columns), "rows": [dict(r) for r in rows]}
    if note:
        spec["note"] = note
    check_panel(name, spec, "panel")
    graph.annotations.setdefault("panels", {})[name] = spec
    return spec


def set_headline(graph: Graph, text: str, *, level: str | None = None, panel: str | None = None,
                 node: str | None = None, module: str | None = None, notes: Sequence[str] = (),
                 overlay: str | None = None) -> dict[str, Any]:
    """Write the analysis's answer on ``graph`` (replacing an earlier one): ``text``, the sentence
    the terminal prints; ``panel``, the panel with the facts behind it (the report opens it on a
    click); ``node``/``module``, what it is about (the report selects it); ``level`` colours it;
    ``notes``, the notes the terminal prints under the answer (``note: ...``), which the report
    shows under it and JSON keeps, each whole; ``overlay``, the overlay the analysis's report opens
    coloured by (a saved graph's report opens with it too)."""
    spec: dict[str, Any] = {"text": text}
    for key, value in (("level", level), ("panel", panel), ("node", node), ("module", module), ("overlay", overlay)):
        if value is not None:
            spec[key] = value
    if notes:
        spec["notes"] = list(notes)
    check_headline(spec, "headline")
    graph.annotations["headline"] = spec
    return spec


def headline(graph: Graph) -> str:
    """The analysis's answer written on ``graph`` by :func:`set_headline` (``""``: none)."""
    spec = graph.annotations.get("headline")
    return str(spec.get("text", "")) if isinstance(spec, dict) else ""


def panels(graph: Graph) -> dict[str, dict[str, Any]]:
    """The graph's panels, in the order they were written."""
    return dict(graph.annotations.get("panels") or {})


__all__ = ["headline", "panels", "row", "set_headline", "set_panel"]
