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


def test_the_forward_draws_a_box_per_checkpoint_call_on_both_paths() -> None:
    torch.manual_seed(0)
    model, x = TwoCalls(), torch.randn(4, 8)
    with torch_frames() as frames, torch.no_grad():
        model(x)
    eager = fxviz.capture(model, (x,), method="eager")
    export = fxviz.capture(model, (x,), method="export")
    assert len(frames) == 2
    assert regions(eager) == [("checkpoint", ["", "a"], ["forward"]), ("checkpoint", ["", "b"], ["forward"])]
    # non-strict export traces through the calls: the ops each made, as it ran them (never ``c``, on the
    # second call's line but outside it); decomposed, the same ops
    decomposed = fxviz.capture(model, (x,), method="export-decomposed")
    assert regions(export) == regions(eager) and [r[1] for r in regions(decomposed)] == [["", "a"], ["", "b"]]


def test_a_loop_that_checkpoints_each_block_from_one_line_is_one_box_per_call() -> None:
    """The stack traces of a loop's calls are the same line: the calls seen run tell them apart."""
    from tests import capture_models as cm

    model, args, _ = cm.checkpoint_plain()
    with torch_frames() as frames:
        model(*args).sum().backward()
    model.zero_grad(set_to_none=True)
    want = [("checkpoint", ["blocks.0.0", "blocks.0.1"], ["forward"]),
            ("checkpoint", ["blocks.1.0", "blocks.1.1"], ["forward"])]
    assert len(frames) == len(want)
    assert regions(fxviz.capture(model, args, method="eager")) == regions(fxviz.capture(model, args, method="export")) == want
