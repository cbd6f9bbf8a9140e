"""Renderers: pure functions of the IR (and what passes put on it). No torch.

``tree`` (rich terminal tree), ``html`` (self-contained interactive report, notebooks), ``dot``
(Graphviz DOT/SVG/PNG/PDF), ``diff`` (a :class:`~fxviz.graphdiff.Diff` as a terminal report or a
page). ``view`` holds what they share: labels, op families, colours, module boxes.

Importing this package registers the renderers in :data:`fxviz.ir.VIEWS`, which is how
``Graph.tree()``, ``print(graph)``, ``graph.to_html()`` and a notebook's inline report reach them
without the IR importing its renderers (the IR sits below them; ``import fxviz`` imports this).
"""

from __future__ import annotations

from fxviz.ir import VIEWS
from fxviz.render import diff, dot, html, tree
from fxviz.render.files import write_text

VIEWS.update({
    "tree": tree.TreeView,
    "text": tree.tree_text,
    "html": html.to_html,
    "repr_html": html.repr_html,
    "dot": dot.to_dot,
    "image": dot.write_image,
    "diff_report": diff.DiffView,
    "diff_text": diff.report_text,
    "diff_html": diff.to_html,
})

__all__ = ["diff", "dot", "html", "tree", "write_text"]
