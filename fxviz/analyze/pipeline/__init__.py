"""The compiler-pass pipeline analyzer: the program after every pass, what each pass changed,
where each node came from, and the first pass that changes the numbers.

``fxviz.pipeline(model, args)`` exports the model and runs the passes (default: core ATen
decomposition) one stage at a time (:mod:`.run`); each pass kind becomes one step (:mod:`.steps`);
nodes are tied to the stage before (:mod:`.links`); outputs are checked against eager (:mod:`.numbers`);
the result is plain data (:mod:`.result`), drawn with the graph's overlays and panels (:mod:`.views`).
A saved pipeline (``Pipeline.to_json``) reads back without torch: what runs passes is imported on
first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fxviz.analyze.pipeline.result import Divergence, Numbers, Pipeline, Stage, StageError

if TYPE_CHECKING:
    from fxviz.analyze.pipeline.run import DEFAULT_PASSES, load_program, pipeline
    from fxviz.analyze.pipeline.steps import on_program

_LAZY = {"DEFAULT_PASSES": "fxviz.analyze.pipeline.run", "load_program": "fxviz.analyze.pipeline.run",
         "pipeline": "fxviz.analyze.pipeline.run", "on_program": "fxviz.analyze.pipeline.steps"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'fxviz.analyze.pipeline' has no attribute {name!r}")


__all__ = ["DEFAULT_PASSES", "Divergence", "Numbers", "Pipeline", "Stage", "StageError", "load_program", "on_program",
           "pipeline"]
