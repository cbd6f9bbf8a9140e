"""The compiler-pass pipeline analyzer: the program after every pass, what each pass changed,
where each node came from, and the first pass that changes the numbers.

``fxviz.pipeline(model, args)`` exports the model and runs the passes (default: core ATen
decomposition) one stage at a time (:mod:`.run`); each pass kind becomes one step (:mod:`.steps`);
nodes are tied to the stage before (:mod:`.links`); outputs are checked against eager (:mod:`.numbers`);
the result is plain data (:mod:`.result`), drawn with the graph's overlays and panels (:mod:`.views`).
"""

from __future__ import annotations

from fxviz.analyze.pipeline.result import Divergence, Numbers, Pipeline, Stage, StageError
from fxviz.analyze.pipeline.run import DEFAULT_PASSES, load_program, pipeline
from fxviz.analyze.pipeline.steps import on_program

__all__ = ["DEFAULT_PASSES", "Divergence", "Numbers", "Pipeline", "Stage", "StageError", "load_program", "on_program",
           "pipeline"]
