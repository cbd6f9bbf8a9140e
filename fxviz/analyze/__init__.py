"""Analyzers: analyses that need torch, run at capture time, each writing an overlay on the graph
(:mod:`fxviz.passes.overlays`), so a saved graph shows their results without torch.

``flops`` (:mod:`fxviz.analyze.flops`): forward FLOPs from torch's own formulas.
"""
