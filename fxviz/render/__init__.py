"""Renderers: pure functions of the IR (and what passes put on it). No torch.

``tree`` (rich terminal tree), ``html`` (self-contained interactive report, notebooks), ``dot``
(Graphviz DOT/SVG/PNG/PDF), ``diff`` (a :class:`~fxviz.graphdiff.Diff` as a terminal report or a
page). ``view`` holds what they share: labels, op families, colours, module boxes.

Importing this package registers the renderers in :data:`fxviz.ir.VIEWS`, which is how
``Graph.tree()``, ``print(graph)``, ``graph.to_html()`` and a notebook's inline report reach them
without the IR importing its renderers (the IR sits below them; ``import fxviz`` imports this).
Each renderer's module is imported on its first call, not here: ``fxviz tree g.json`` should not
pay for jinja2 and the diff renderer (half of the command's start-up time).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from fxviz.ir import VIEWS
from fxviz.render.files import write_text


def _on_first_call(module: str, name: str) -> Callable[..., Any]:
    """``fxviz.render.<module>.<name>``, imported when it is first called."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(f"fxviz.render.{module}"), name)(*args, **kwargs)

    call.__qualname__ = call.__name__ = f"{module}.{name}"
    return call


VIEWS.update({
    "tree": _on_first_call("tree", "TreeView"),
    "text": _on_first_call("tree", "tree_text"),
    "html": _on_first_call("html", "to_html"),
    "repr_html": _on_first_call("html", "repr_html"),
    "dot": _on_first_call("dot", "to_dot"),
    "image": _on_first_call("dot", "write_image"),
    "diff_report": _on_first_call("diff", "DiffView"),
    "diff_text": _on_first_call("diff", "report_text"),
    "diff_html": _on_first_call("diffpage", "to_html"),
    "diff_repr_html": _on_first_call("diffpage", "repr_html"),
})

__all__ = ["diff", "dot", "html", "tree", "write_text"]
