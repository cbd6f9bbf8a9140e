"""The compile map's eager graph without the forward's heavy arithmetic (issue 18 point 11): the
convolution and product kernels run once, in the compiled run, and the eager graph is still the
real trace's; each skipped kernel's output has the metadata the kernel gives; a value read traces
the forward for real; the multiply-accumulates that decide are torch's own count."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
import torch._dynamo as dynamo
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import fxviz.analyze.compilemap.skim as skim
from fxviz.analyze.compilemap import compile_map
from fxviz.analyze.compilemap.record import GraphRecord, OpRecord, Recording
from fxviz.analyze.flops import CAPTURE_PASSES
from fxviz.fallback.shapes_only import ShapesOnly
from fxviz.fallback.trace import trace_eager
from fxviz.passes import run_passes

aten = torch.ops.aten


class Net(nn.Module):
    """Convolutions, a linear and a batched product: every kind ShapesOnly skips. At 2x3x64x64,
    400 M multiply-accumulates: worth skipping (20 ms against 7 ms for the meta kernels)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 32, 3, padding=1)
        self.bn = nn.BatchNorm2d(32)
        self.body = nn.Sequential(*[nn.Conv2d(32, 32, 3, padding=1) for _ in range(5)])
        self.down = nn.Conv2d(32, 64, 3, stride=2, groups=2)
        self.fc = nn.Linear(64 * 3 * 3, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.down(self.body(torch.relu(self.bn(self.conv(x)))))
        y = self.fc(nn.functional.adaptive_avg_pool2d(h, 3).flatten(1)).view(-1, 2, 3)
        return torch.bmm(y, y.transpose(1, 2)).softmax(-1)


class ReadsAValue(Net):
    """Hands a value of its activations to Python: Dynamo compiles it whole only with
    ``capture_scalar_outputs``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x)
        return h / (1 + h.abs().max().item())


def _x() -> torch.Tensor:
    return torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))


def _key(graph: Any) -> list[tuple[Any, ...]]:
    return [(n.name, n.target, n.module, n.source, n.outputs, n.inputs, n.attrs) for n in graph.nodes]


def _kernels(fn: Any) -> Counter[str]:
    """torch.profiler's count of the convolution kernels ``fn`` ran (``aten::_convolution`` is
    called from inside the kernel, past the dispatcher's entry that a dispatch mode answers)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return Counter(e.name for e in prof.events() if e.name == "aten::_convolution")


@pytest.fixture
def one_thread() -> Any:
    """torch on one thread, as the benchmarks run it (and the figures in skim's docstring)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_each_convolution_kernel_runs_once_and_the_graph_is_the_real_traces(one_thread: None) -> None:
    """The compile map ran the forward's kernels twice: in the compiled run and in the eager trace
    (on one thread the old choice between a real and a fake trace took the real one: 0.03 s of
    compiled run against 0.09 s estimated on fake tensors). Where Dynamo broke no graph the trace
    skips them (and the products); torch's profiler counts the convolutions."""
    torch.manual_seed(0)
    model, x = Net().eval(), _x()
    with torch.no_grad():
        once = _kernels(lambda: model(x))
    assert once == {"aten::_convolution": 7}
    cmap: list[Any] = []
    assert _kernels(lambda: cmap.append(compile_map(model, (x,), backend="aot_eager"))) == once
    (cm,) = cmap
    assert (len(cm.graphs), cm.break_count, cm.share) == (1, 0, 1.0)
    assert _key(cm.graph) == _key(run_passes(trace_eager(model, (x,)), CAPTURE_PASSES))


def test_a_value_read_under_the_skipped_kernels_traces_the_forward_for_real(monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``capture_scalar_outputs`` Dynamo compiles ``.item()`` without a break; the skipped
    convolution's zeros would make its value 0: the read stops the skimmed run, and the graph is
    the real trace's (the Python value included)."""
    monkeypatch.setattr(skim, "MAC_S", 1.0)
    torch.manual_seed(0)
    model, x = ReadsAValue().eval(), _x()
    mode = ShapesOnly()
    with pytest.raises(Exception, match="_local_scalar_dense"):
        trace_eager(model, (x,), watch=lambda _: mode)
    assert mode.read == "aten._local_scalar_dense.default" and mode.skipped == 1
    with dynamo.config.patch(capture_scalar_outputs=True):
        cm = compile_map(model, (x,), backend="aot_eager")
    assert cm.break_count == 0
    real = run_passes(trace_eager(model, (x,)), CAPTURE_PASSES)
    assert _key(cm.graph) == _key(real)
    item = next(n for n in real.nodes if n.name == "item")
    with torch.no_grad():
        assert float(item.outputs[0].value) == pytest.approx(model.conv(x).abs().max().item())


def _strided(t: torch.Tensor, fmt: torch.memory_format = torch.contiguous_format) -> torch.Tensor:
    return t.contiguous(memory_format=fmt)


CASES = {
    "mm": (aten.mm.default, lambda: (torch.randn(5, 3), torch.randn(3, 4)), True),
    "mm-transposed": (aten.mm.default, lambda: (torch.randn(3, 5).t(), torch.randn(4, 3).t()), True),
    "addmm-row-bias": (aten.addmm.default, lambda: (torch.randn(4), torch.randn(5, 3), torch.randn(3, 4)), True),
    "addmm-column-bias": (aten.addmm.default, lambda: (torch.randn(5, 1), torch.randn(3, 5).t(), torch.randn(3, 4)), True),
    "bmm": (aten.bmm.default, lambda: (torch.randn(2, 5, 3), torch.randn(2, 4, 3).transpose(1, 2)), True),
    "mm-bfloat16": (aten.mm.default, lambda: (torch.randn(5, 3).bfloat16(), torch.randn(3, 4).bfloat16()), True),
    "mm-int": (aten.mm.default, lambda: (torch.ones(5, 3, dtype=torch.long), torch.ones(3, 4, dtype=torch.long)), False),
    "conv-strided": (aten.convolution.default, lambda: (torch.randn(1, 3, 9, 9), torch.randn(4, 3, 3, 3), torch.randn(4),
                                                        [2, 2], [1, 1], [1, 1], False, [0, 0], 1), True),
    "conv-transposed-grouped": (aten.convolution.default, lambda: (torch.randn(1, 4, 9, 9), torch.randn(4, 2, 3, 3), None,
                                                                   [2, 2], [1, 1], [1, 1], True, [1, 1], 2), True),
    # a channels-last kernel's layout is the backend's: the meta kernel says contiguous, so it runs
    "conv-channels-last": (aten.convolution.default, lambda: (_strided(torch.randn(1, 3, 9, 9), torch.channels_last),
                                                              torch.randn(4, 3, 3, 3), None, [1, 1], [0, 0], [1, 1],
                                                              False, [0, 0], 1), False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_skipped_kernels_output_has_the_kernels_metadata(case: str) -> None:
    func, make, skipped = CASES[case]
    args = make()
    real = func(*args)
    mode = ShapesOnly()
    with mode:
        out = func(*args)
    assert mode.skipped == int(skipped)
    assert (out.shape, out.stride(), out.dtype, out.device, out._version, out._base) == \
        (real.shape, real.stride(), real.dtype, real.device, real._version, real._base)


class Products(nn.Module):
    """Every spelling of a product a Dynamo graph calls: a broadcast ``matmul``, one tensor times
    itself, ``addmm``, a ``linear`` without bias, a transposed convolution."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 16))
        self.up = nn.ConvTranspose2d(3, 4, 3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = x.flatten(2)[..., :16] @ self.w  # (2, 3, 16) @ (16, 16)
        sq = self.w @ self.w
        a = torch.addmm(self.w[0], m[0], sq)
        lin = nn.functional.linear(a, self.w)
        return self.up(x[:, :, :8, :8]).sum() + lin.sum()


@pytest.mark.parametrize("make", [Net, Products])
def test_the_multiply_accumulates_are_torchs_flop_count_halved(monkeypatch: pytest.MonkeyPatch, make: type[nn.Module]) -> None:
    """What decides to skip the kernels is their arithmetic, counted on Dynamo's graph at the sizes
    it traced by the formulas the ``flops`` pass uses: torch's FlopCounterMode over the same
    forward counts two flops per multiply-accumulate."""
    seen: list[skim.Arithmetic] = []
    monkeypatch.setattr(skim.Arithmetic, "worth_skimming", lambda self: seen.append(self) or False)
    torch.manual_seed(0)
    model, x = make().eval(), _x()
    compile_map(model, (x,), backend="aot_eager")
    (arithmetic,) = seen
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(x)
    assert 2 * sum(arithmetic.macs.values()) == counter.get_total_flops() > 0


def test_skimming_is_chosen_where_the_arithmetic_costs_more_than_it_adds() -> None:
    """Figures on one CPU core: ResNet-18's 69 ops hold 1.8 G multiply-accumulates (0.09 s; its trace
    is 0.11 s for real, 0.04 s skimmed); a 300-layer MLP of 8x64 products 9.8 M (0.5 ms; 0.06 s for
    real, 0.09 s skimmed); only the first input set's runs count, each run of a graph once."""

    def worth(macs: list[int], *graphs: tuple[int, list[str]], runs: list[tuple[int, int]] | None = None) -> bool:
        a = object.__new__(skim.Arithmetic)
        a.rec = Recording([GraphRecord(f"g{k}", "forward", "m.py", 1, s, [OpRecord(n, "", "m.py", 2) for n in names])
                           for k, (s, names) in enumerate(graphs)],
                          runs if runs is not None else [(k, s) for k, (s, _) in enumerate(graphs)])
        a.macs = dict(enumerate(macs))
        return a.worth_skimming()

    resnet = ["conv2d", "batch_norm"] * 20 + ["relu"] * 17 + ["add"] * 8 + ["max_pool2d", "adaptive_avg_pool2d", "flatten", "linear"]
    assert worth([1_814_000_000], (0, resnet))
    assert not worth([9_830_400], (0, ["linear", "relu", "add"] * 300))
    assert not worth([1_000, 1_814_000_000], (0, ["linear"] * 3), (1, resnet), runs=[(0, 0), (1, 1)])
