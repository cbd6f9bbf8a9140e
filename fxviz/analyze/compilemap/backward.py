"""Run the first input set's training step under compiled autograd with the map's recording
backend, and build :class:`~fxviz.analyze.compilemap.result.CompiledBackward` from the recording
and torch's structured trace of the run. Needs torch (:mod:`.autograd` is the torch-free part)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from fxviz.analyze.compilemap.autograd import assign_modules, autograd_graphs
from fxviz.analyze.compilemap.breaks import group_breaks
from fxviz.analyze.compilemap.record import Recorder, Recording, compiled_graph
from fxviz.analyze.compilemap.result import CompiledBackward
from fxviz.analyze.inside.live import differentiate
from fxviz.errors import TargetError
from fxviz.ir import Graph


class Autograd:
    """The compiled-autograd part of one compile-map run: its structured trace and its step."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        """torch's structured trace of the run, AOT Autograd's cache off (compiled autograd cannot
        use a backward that cache served: torch raises)."""
        from torch._functorch import config as functorch_config

        from fxviz.torchbridge.tracelog import structured_trace

        with structured_trace() as events, functorch_config.patch({"enable_autograd_cache": False}):
            self.events = events
            yield

    def run(self, forward: Callable[[], Any], recorder: Recorder, leaves: Sequence[torch.Tensor]) -> None:
        """The forward and its backward (the outputs' sum differentiated once, no ``.grad`` written)
        under ``torch._dynamo.compiled_autograd._enable`` with the recorder's compile (the backward
        graphs go through the same recording backend, as ``config.compiled_autograd`` makes them)."""
        try:
            from torch._dynamo.compiled_autograd import _enable
        except ImportError as e:  # another torch
            raise TargetError("this torch has no torch._dynamo.compiled_autograd._enable: compiled autograd "
                              "is not covered") from e
        rec = recorder.rec
        with _enable(recorder.compile):
            out = forward()
            rec.phase = "backward"
            try:
                differentiate(out, leaves)
            finally:
                rec.phase = "forward"

    def build(self, rec: Recording, graph: Graph, eager: Graph) -> CompiledBackward:
        """What the backward did: torch's captured graphs (their node calls given the modules of
        ``eager``'s backward ops, :func:`~fxviz.analyze.compilemap.autograd.assign_modules`), the
        Dynamo graphs compiled from them and their breaks."""
        from fxviz.tracefile import read_events

        captured = autograd_graphs(read_events(self.events))
        ops = [(str(n.target), n.stack[-1][0] if n.stack else "") for n in eager.ops if n.phase == "backward"]
        assign_modules(captured, ops)
        graphs = [compiled_graph(g) for g in rec.graphs if g.phase == "backward"]
        breaks = group_breaks([b for b in rec.breaks if b.phase == "backward"], graph, graph.calls, {}, logged=True)
        return CompiledBackward(captured, graphs, breaks)


__all__ = ["Autograd"]
