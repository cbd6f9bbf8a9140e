"""Renderers: pure functions of the IR (and what passes put on it).

``tree`` (rich terminal tree), ``html`` (self-contained interactive report, notebooks), ``dot``
(Graphviz DOT/SVG/PNG/PDF). ``view`` holds what they share: labels, op kinds, colours, module boxes.
"""
