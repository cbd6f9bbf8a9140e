"""Compare two captured graphs: where they agree, where they part, and why.

:func:`diff` aligns two :class:`~fxviz.ir.Graph` s in two steps and classifies what it finds:

1. **module calls** (:mod:`~fxviz.graphdiff.modules`), read from each graph's call tree: a call is
   keyed by its full ``stack`` (module path and call index at every level), so ``h.0.attn`` in the
   first call of ``h.0`` meets its counterpart in the other graph whatever ran before it;
2. **ops inside each call** (:mod:`~fxviz.graphdiff.differ`), in execution order, folded into the
   torch-level call they came from, so ``F.linear`` meets ``aten.linear`` however either side
   spelt it, and aligned (:mod:`~fxviz.graphdiff.align`) with a longest common subsequence whose
   ties are broken by the names themselves, never by which graph came first: ``diff(a, b)`` is
   ``diff(b, a)`` mirrored, by construction.

Kinds of difference (:data:`KINDS`): ``assumption`` (a condition on the inputs one capture took as
given, e.g. ``x.shape[0] > 2`` where the forward branches on a size), ``only_in_a`` / ``only_in_b``
(ops or whole module calls), ``calls`` (a module ran a different number of times), ``shape``,
``dtype``, ``capture_failed`` (one graph could not be captured: the failure is placed on the other
graph at the data-dependent node behind it, :mod:`~fxviz.graphdiff.captures`), and two
informational kinds that do not mean the computations differ: ``decomposed`` (one torch call,
different ATen ops) and ``symbolic_shape`` (``s0`` on one side, ``128`` on the other). Ops that
only one side records for bookkeeping (an assert export inserts, a call that hands its input back)
are ``only_in`` with a ``note`` and count as informational too.

The result is a :class:`Diff` (:mod:`~fxviz.graphdiff.result`, its parts in
:mod:`~fxviz.graphdiff.parts`): plain data that renders through :mod:`fxviz.render` and writes and
reads itself as JSON. No torch here, so a diff of two saved JSON graphs runs anywhere.

    >>> d = diff(g, g)
    >>> bool(d), d.summary()
    (False, {})
"""

from __future__ import annotations

from fxviz.graphdiff.align import align
from fxviz.graphdiff.differ import diff
from fxviz.graphdiff.parts import (
    INFORMATIONAL_KINDS,
    INFORMATIONAL_NOTES,
    KINDS,
    Difference,
    ModuleDiff,
    Row,
    Side,
)
from fxviz.graphdiff.result import Diff

__all__ = [
    "INFORMATIONAL_KINDS", "INFORMATIONAL_NOTES", "KINDS", "Diff", "Difference", "ModuleDiff", "Row", "Side",
    "align", "diff",
]
