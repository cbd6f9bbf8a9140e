"""Symbolic capture: model + example inputs -> :class:`fxviz.ir.Graph` through torch.export
(non-strict, strict, decomposed) and torch.fx (``symbolic``), with the one fx -> IR converter
(``convert``). ``export`` and ``fx`` hold one method each. Which method runs when is decided by :mod:`fxviz.api`.
"""
