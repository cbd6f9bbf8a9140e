"""A break in a function Dynamo compiles once per call (a guard on its module argument fails each
time) and that makes no graph: each call passed the break, though no graph ran to count it. As
transformers' output capturing does on a model's first call (``register_forward_hook`` per
submodule: ``RemovableHandle.next_id += 1``, a setattr Dynamo cannot trace), from a loop Dynamo
gave up on. Torch's record: its compilation metrics hold one compile of ``install`` per call, each
restarted by the break, and ``counters["graph_break"]`` logs it once more for the forward, which
broke at the inlined call; the model counts its calls itself."""

from __future__ import annotations

import torch
import torch._dynamo as dynamo
from torch import nn
from torch._dynamo.utils import clear_compilation_metrics, counters, get_compilation_metrics

from fxviz.analyze.compilemap import compile_map

CALLS: list[str] = []


def _hook(mod: nn.Module, inp: object, out: object) -> None:
    return None


def install(m: nn.Module) -> None:
    CALLS.append(type(m).__name__)
    m.register_forward_hook(_hook).remove()  # RemovableHandle.next_id += 1: a graph break


def walk(model: nn.Module) -> None:
    for c in model.children():  # a break inside the loop: Dynamo runs this frame eagerly
        install(c)


class Hooked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.a(x)
        walk(self)
        return self.c(self.b(x))


def test_a_break_passed_once_per_compile_of_a_graphless_frame_counts_each_pass() -> None:
    torch.manual_seed(0)
    model, x = Hooked().eval(), torch.randn(2, 4)
    cmap = compile_map(model, (x,), backend="eager")

    CALLS.clear()
    dynamo.reset()
    counters.clear()
    clear_compilation_metrics()
    with torch.no_grad():
        torch.compile(model, backend="eager")(x)
    installs = [m for m in get_compilation_metrics() if m.co_name == "install"]
    logged = sum(n for k, n in counters["graph_break"].items() if k.startswith("setattr() on unsupported type"))
    dynamo.reset()
    assert len(CALLS) == 3 and len(installs) == 3  # one compile per call, each broke at the setattr
    assert all(m.graph_op_count == 0 and m.restart_reasons for m in installs)  # no graph ran to count it
    assert logged == 4  # the three and the forward's, at the inlined call
    (brk,) = [b for b in cmap.breaks if b.category != "skip"]
    assert brk.where is not None and brk.where.func == "install"
    assert brk.count == len(CALLS) == 3
