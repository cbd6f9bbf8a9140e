"""Analyzers: analyses that need torch, run at capture time, each writing an overlay on the graph
(:mod:`fxviz.passes.overlays`), so a saved graph shows their results without torch.

``flops`` (:mod:`fxviz.analyze.flops`): forward FLOPs from torch's own formulas.
``compilemap`` (:mod:`fxviz.analyze.compilemap`): which ops torch.compile ran in which graph, its
graph breaks and recompiles, as overlays and panels on the eager graph.
"""
