"""The eager tracer and the export path draw the same ``torch.utils.checkpoint`` regions: one per call
torch ran, around that call's forward ops, their recomputation and their backward ops."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.utils.checkpoint

import fxviz
from fxviz.calls import call_tree
from fxviz.ir import Graph
from tests.test_backward_recompute_export import TwoCalls


@contextmanager
def torch_frames() -> Iterator[list[Any]]:
    """torch's record of a run: one ``_CheckpointFrame`` per non-reentrant checkpoint call."""
    cls = torch.utils.checkpoint._CheckpointFrame
    init, frames = cls.__init__, []

    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        frames.append(self)
        init(self, *args, **kwargs)

    cls.__init__ = counted  # type: ignore[method-assign]
    try:
        yield frames
    finally:
        cls.__init__ = init  # type: ignore[method-assign]


def regions(g: Graph) -> list[tuple[str, list[str], list[str]]]:
    """Each region: its label, the modules of its ops and the phases of its ops."""
    by_name = {n.name: n for n in g.nodes}
    return [(r.label, sorted({by_name[x].module for x in r.nodes}), sorted({by_name[x].phase for x in r.nodes}))
            for r in call_tree(g.nodes).regions]


def test_eager_and_export_draw_the_same_region_per_checkpoint_call() -> None:
    torch.manual_seed(0)
    model, x = TwoCalls(), torch.randn(4, 8)
    with torch_frames() as frames:
        model(x).sum().backward()
    model.zero_grad(set_to_none=True)
    calls = len(frames)
    eager = fxviz.capture(model, (x,), backward=True, method="eager")
    export = fxviz.capture(model, (x,), backward=True, method="export")
    want = [("checkpoint", ["", "a"], ["backward", "forward", "recompute"]),
            ("checkpoint", ["", "b"], ["backward", "forward", "recompute"])]
    assert calls == 2 and regions(eager) == regions(export) == want, (regions(eager), regions(export))
    # each recompute node repeats a forward op of its own call (the second call's tanh is not the first's)
    fwd = {n.name: n for n in eager.ops if n.phase == "forward"}
    again = [n for n in eager.ops if n.phase == "recompute"]
    assert len(again) == 4 and all(n.attrs["checkpoint"] == fwd[n.attrs["recomputes"]].attrs["checkpoint"] for n in again)
    assert {n.module for n in eager.ops if n.phase == "backward" and "checkpoint" in n.attrs} == {"", "a", "b"}


def test_the_eager_forward_draws_a_box_per_checkpoint_call_as_export_does() -> None:
    torch.manual_seed(0)
    model, x = TwoCalls(), torch.randn(4, 8)
    with torch_frames() as frames, torch.no_grad():
        model(x)
    eager = fxviz.capture(model, (x,), method="eager")
    export = fxviz.capture(model, (x,), method="export")
    assert len(frames) == 2
    assert regions(eager) == [("checkpoint", ["", "a"], ["forward"]), ("checkpoint", ["", "b"], ["forward"])]
    assert [r[0] for r in regions(export)] == [r[0] for r in regions(eager)]
