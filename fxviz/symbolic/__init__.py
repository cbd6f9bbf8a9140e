"""Symbolic capture: model + example inputs -> :class:`fxviz.ir.Graph` through torch.export
(non-strict, strict, decomposed) and torch.fx (``symbolic``), with the one fx -> IR converter
(``convert``), which converts the bodies of higher-order ops in place (``hops``: ``no_grad``,
``autocast``, ``checkpoint``, ``cond``, ``while_loop``, ... in regions). ``export`` and ``fx`` hold
one method each; ``check`` runs an exported program once on real inputs (its assertions, the branch
each ``cond`` takes); ``pt2`` reads saved programs. Which method runs when is decided by :mod:`fxviz.api`.
"""
