"""Under compiled autograd, a frame Dynamo failed to compile while the backward ran is a function
skipped of the backward, as torch's record says: its compilation metrics entry has a compiled
autograd compile id (``!0/3/0``: a frame compiled from a compiled autograd graph). The map read the
metrics once the step was done, when the run was back in its forward phase, and listed the
backward's hook among the forward's breaks."""

from __future__ import annotations

import torch
from torch import nn
from torch._dynamo.utils import clear_compilation_metrics, get_compilation_metrics

from fxviz.analyze.compilemap import compile_map


def _hook(grad: torch.Tensor) -> torch.Tensor:
    try:  # a break inside a try block: Dynamo cannot resume after it, so it fails the whole frame
        torch._dynamo.graph_break()
        return grad * 2
    finally:
        pass


class Hooked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 8), nn.Linear(8, 4)
        self.fc2.weight.register_hook(_hook)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def test_a_frame_that_failed_in_the_compiled_backward_is_the_backwards() -> None:
    torch.manual_seed(0)
    clear_compilation_metrics()  # torch keeps its last 64: a full record would hide this run's entries
    before = len(get_compilation_metrics())
    cmap = compile_map(Hooked(), (torch.randn(3, 8),), backend="eager", grad=True, compiled_autograd=True)
    failed = [m for m in get_compilation_metrics()[before:] if m.fail_type]
    # torch's record: the hook's frame, compiled from the compiled autograd graph, failed; nothing else
    assert [(str(m.compile_id).startswith("!"), m.co_name) for m in failed] == [(True, "_hook")]
    (m,) = failed
    assert cmap.backward is not None
    back = [(g.where.func, g.where.line) for g in cmap.backward.breaks if g.category == "skip" and g.where]
    fwd = [(g.where.func, g.where.line) for g in cmap.breaks if g.category == "skip" and g.where]
    assert back == [(m.co_name, m.co_firstlineno)]
    assert fwd == []
