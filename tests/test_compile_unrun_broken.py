"""Ops a forward that breaks does not run under torch.compile (``if not is_compiling(): ...``)
are ``unrun``, not "ran eagerly": Dynamo never traced their line, in a function it traced. Checked
against torch's own record of the model on the same inputs: the lines Dynamo traced (its
``trace_source`` log, ``TRACE starts_line``), the compilation metrics (no frame failed; each graph's
``graph_op_count``), ``explain``'s graphs (no ``mul``). A frame whose compile failed ran whole and
eagerly, its lines after the failure untraced: those ops stay eager (torch's ``fail_type``)."""

from __future__ import annotations

import inspect
import logging

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import fxviz  # noqa: E402


class BreakThenEagerOnly(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        n = y.sum().item()  # a graph break: .item() runs eagerly
        if not torch.compiler.is_compiling():  # a check eager runs and compiled code skips
            y = y * 2
        return torch.relu(y) + n


class EagerOnlyInside(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        if not torch.compiler.is_compiling():  # between two ops of the one graph
            y = y * 2
        return torch.relu(y)


class BreakInLoop(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(2):
            x = self.fc(x)
            self.n = x.sum().item()  # a break in a loop: Dynamo gives up on the frame
            x = x.sin()
        return x


def _line(cls: type, text: str) -> int:
    lines, first = inspect.getsourcelines(cls.forward)
    return first + next(i for i, ln in enumerate(lines) if text in ln)


def _torch_record(model: nn.Module, x: torch.Tensor) -> tuple[set[int], list[object]]:
    """The lines of this file Dynamo traced and the compilation metrics, of a plain torch.compile run."""
    from torch._dynamo.utils import clear_compilation_metrics, get_compilation_metrics

    traced: set[int] = set()

    class Lines(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            text = record.getMessage()
            if text.startswith("TRACE starts_line") and __file__.rsplit("/", 1)[-1] in text:
                traced.add(int(text.split(__file__.rsplit("/", 1)[-1] + ":", 1)[1].split()[0].split(":")[0]))

    log = logging.getLogger("torch._dynamo.symbolic_convert.__trace_source")
    handler = Lines()
    log.addHandler(handler)
    torch._dynamo.reset()
    clear_compilation_metrics()
    torch._logging.set_logs(trace_source=True)
    try:
        with torch.no_grad():
            torch.compile(model, backend="eager")(x)
        return traced, list(get_compilation_metrics())
    finally:
        torch._logging.set_logs()
        log.removeHandler(handler)
        torch._dynamo.reset()


def test_an_op_a_broken_forward_skips_when_compiling_did_not_run() -> None:
    torch.manual_seed(0)
    model, x = BreakThenEagerOnly(), torch.randn(2, 8)
    traced, metrics = _torch_record(model, x)
    only, brk = _line(BreakThenEagerOnly, "y = y * 2"), _line(BreakThenEagerOnly, ".item()")
    assert brk in traced and only not in traced and traced  # torch: the break's line traced, the branch never
    assert metrics and not any(m.fail_type for m in metrics)  # no frame ran eagerly whole
    cm = fxviz.compile_map(model, (x,), backend="eager")
    by_line = {n.name: n.source.line for n in cm.graph.ops if n.source is not None}
    assert [n for n, ln in by_line.items() if ln == only] == ["mul"]
    assert cm.assigned["mul"] == "unrun" and cm.assigned["item"] == "eager"
    assert cm.break_count == 1
    assert cm.compiled_ops == sum(m.graph_op_count for m in metrics)  # torch's op counts of its graphs
    assert cm.ops == cm.compiled_ops + 1  # the .item(): it ran eagerly; the mul did not run
    assert any("did not run under torch.compile" in n and f":{only}" in n for n in cm.notes)


def test_ops_of_a_frame_that_failed_to_compile_ran_eagerly() -> None:
    torch.manual_seed(0)
    model, x = BreakInLoop(), torch.randn(2, 8)
    traced, metrics = _torch_record(model, x)
    sin = _line(BreakInLoop, "x.sin()")
    assert sin not in traced and [m.fail_type for m in metrics if m.co_name == "forward"] == ["Unsupported"]
    cm = fxviz.compile_map(model, (x,), backend="eager")
    assert "unrun" not in cm.assigned.values()  # the frame ran whole, eagerly: untraced lines ran
    assert cm.compiled_ops == 0 and cm.ops == len(cm.assigned)


def test_an_eager_only_op_between_ops_of_one_graph_is_not_in_it() -> None:
    torch.manual_seed(0)
    model, x = EagerOnlyInside(), torch.randn(2, 8)
    traced, metrics = _torch_record(model, x)
    only = _line(EagerOnlyInside, "y = y * 2")
    assert only not in traced and [m.graph_op_count for m in metrics] == [2]  # torch: linear, relu
    cm = fxviz.compile_map(model, (x,), backend="eager")
    assert cm.assigned == {"linear": "g0", "mul": "unrun", "relu": "g0"}
    assert cm.compiled_ops == cm.ops == 2 and cm.share == 1.0
