"""What the CLI is pointed at, and how it becomes a graph.

``parse`` recognises a target without torch: a saved graph (``g.json``, or ``-`` for standard
input), a ``.pt2`` file written by ``torch.export.save``, or a factory (``path/to/file.py:build``,
``package.module:build``); it also reads saved graphs, so ``fxviz tree g.json`` runs where torch is
not installed. ``factory`` imports torch: it calls a factory for a model and its inputs, and loads
``.pt2`` files.

This ``__init__`` imports nothing, so importing ``fxviz.targets.parse`` never imports torch.
"""
