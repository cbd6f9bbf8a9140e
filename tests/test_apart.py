"""Symbolic attempts run apart, in a forked child (``fxviz.torchbridge.apart``): what export keeps
alive is given back when the child exits (measured by ``bench/memory.py``); here, that the graph,
the failures, the interrupts and the model come back as an in-process capture gives them."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import fxviz
from fxviz.errors import CaptureError
from fxviz.torchbridge import apart as apart_module
from fxviz.torchbridge.apart import Relayed, run_apart, worth_isolating
from tests.statecheck import kept

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX-only")


class Deep(nn.Module):
    """A stack deep enough to run apart by default, which writes the pid of every process its
    forward runs in to ``log`` (a file: the child's memory does not come back), and steps a
    buffer (a child's change must not reach the parent's model)."""

    def __init__(self, log: Path | None, layers: int = 64, branch: bool = False) -> None:
        super().__init__()
        self.log, self.branch = str(log or ""), branch
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(layers))
        self.register_buffer("steps", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.log:  # (strict export cannot trace a file's open: it is given no log)
            with open(self.log, "a") as f:
                f.write(f"{os.getpid()}\n")
        self.steps.add_(1)
        for layer in self.layers:
            x = layer(x)
        if self.branch and x.sum() > 0:  # a decision on data: export fails here
            x = x + 1
        return x


def _pids(log: Path) -> set[int]:
    return {int(p) for p in log.read_text().split()} if log.exists() else set()


def _signature(g: fxviz.Graph) -> list[tuple[str, str, str]]:
    return [(n.name, n.target, n.module) for n in g.nodes]


def test_a_deep_model_is_captured_apart_with_the_same_graph(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(apart_module, "ISOLATE_FROM_MODULES", 64)  # 1,024 by default: a slow model to export
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    x = torch.randn(64, 64)
    (x @ x).sum()  # the parent used OpenMP's pool: a child that used it too would hang
    torch.set_num_threads(threads)
    log = tmp_path / "pids"
    model, inp = Deep(log), torch.randn(2, 8)
    assert worth_isolating(model) and not worth_isolating(nn.Linear(2, 2))
    with kept(model, (inp,), {}):
        apart = fxviz.capture(model, (inp,), method="export")
    assert _pids(log) and os.getpid() not in _pids(log)
    log.unlink()
    here = fxviz.capture(model, (inp,), method="export", isolate=False)
    assert _pids(log) == {os.getpid()}
    assert _signature(apart) == _signature(here)
    assert len(apart.ops) == 64 + 1 and apart.method == "export"
    assert [(a.method, a.ok) for a in apart.attempts] == [("export", True)]
    assert float(model.steps) == 0.0  # the child's step stayed in the child; the parent's was put back


def test_the_buffer_a_child_steps_stays_the_parents(tmp_path: Path) -> None:
    for log in (tmp_path / "pids", None):
        model = Deep(log, layers=4)
        for method in ("export",) if log else ("export-strict",):
            g = fxviz.capture(model, (torch.randn(2, 8),), method=method, isolate=True)
            assert g.method == method and len(g.ops) >= 4
        assert float(model.steps) == 0.0
    assert _pids(tmp_path / "pids") and os.getpid() not in _pids(tmp_path / "pids")


def test_a_failure_apart_is_recorded_as_it_is_in_process(tmp_path: Path) -> None:
    model, inp = Deep(tmp_path / "pids", layers=3, branch=True), torch.ones(2, 8)
    apart = fxviz.capture(model, (inp,), isolate=True)
    here = fxviz.capture(model, (inp,), isolate=False)
    assert apart.method == here.method == "eager"
    for a, b in zip(apart.attempts, here.attempts, strict=True):
        assert (a.method, a.ok, a.skipped, a.error_type) == (b.method, b.ok, b.skipped, b.error_type)
        assert a.message.splitlines()[:1] == b.message.splitlines()[:1]
        assert a.source == b.source
    first = apart.attempts[0]
    assert first.error_type == "GuardOnDataDependentSymNode"
    assert first.source is not None and first.source.file == __file__ and "x.sum() > 0" in first.source.code


class Raises(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError("the model refuses")


def test_an_exception_of_the_model_comes_back_with_its_type_and_line() -> None:
    with pytest.raises(CaptureError) as info:
        fxviz.capture(Raises(), (torch.randn(2),), method="export", isolate=True)
    (a,) = info.value.attempts
    assert (a.method, a.ok, a.error_type, a.message) == ("export", False, "ValueError", "the model refuses")
    assert a.source is not None and a.source.func == "forward" and a.source.file == __file__


def test_what_does_not_unpickle_is_relayed_by_name() -> None:
    class Odd(Exception):
        def __init__(self, code: int, text: str) -> None:
            super().__init__(text)
            self.code = code

    def fail() -> None:
        raise Odd(3, "odd failure")

    with pytest.raises(Relayed) as info:
        run_apart(fail, lambda e: None)
    assert (info.value.type_name, str(info.value)) == ("Odd", "odd failure")


def test_a_child_that_dies_is_a_capture_error() -> None:
    def die() -> Any:
        os.kill(os.getpid(), signal.SIGKILL)

    with pytest.raises(CaptureError, match="killed by signal SIGKILL .out of memory.*isolate=False"):
        run_apart(die, lambda e: None)


def test_an_interrupt_in_the_child_ends_the_capture() -> None:
    def interrupted() -> Any:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_apart(interrupted, lambda e: None)


def test_the_result_comes_back_whole() -> None:
    assert run_apart(lambda: {"pid": os.getpid(), "t": torch.arange(3)}, lambda e: None)["t"].tolist() == [0, 1, 2]
    assert run_apart(lambda: os.getpid(), lambda e: None) != os.getpid()


def test_a_child_past_its_memory_budget_is_stopped_and_said(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.export's memory grows with the square of the nesting depth (past 24 GB at 2,000
    modules deep): the child is stopped at its budget with that said, before the kernel's
    out-of-memory killer picks a process."""
    monkeypatch.setenv(apart_module.MEMORY_ENV, "64M")

    def hungry() -> int:
        held = torch.ones(64 * 2**20)  # 256 MB, written
        time.sleep(2)  # the watcher reads every 50 ms
        return int(held[0])

    with pytest.raises(CaptureError, match=r"used more than 64 MB of memory and was stopped after [\d.]+ s .*FXVIZ_CAPTURE_MEMORY"):
        run_apart(hungry, lambda e: None)
    assert run_apart(lambda: int(torch.ones(1024)[0]), lambda e: None) == 1  # a small child is left alone


def test_a_capture_whose_symbolic_attempts_pass_the_budget_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every attempt run apart is held to the budget; the eager tracer, which runs in process, is
    the chain's answer, and each stopped attempt says why."""
    import fxviz.api

    monkeypatch.setenv(apart_module.MEMORY_ENV, "64M")

    def hungry(real: Any) -> Any:  # the symbolic method, after writing 256 MB (export's deep-model growth)
        def capture(*args: Any) -> Any:
            held = torch.ones(64 * 2**20)
            time.sleep(2)  # the watcher reads every 50 ms
            return real(*args) if held[0] else None
        return capture

    for method in fxviz.api.SYMBOLIC:
        monkeypatch.setitem(fxviz.api.CAPTURERS, method, hungry(fxviz.api.CAPTURERS[method]))
    g = fxviz.capture(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), (torch.randn(2, 4),), isolate=True)
    assert g.method == "eager" and len(g.ops) == 2
    stopped = [a for a in g.attempts if not a.ok and not a.skipped]
    assert stopped and all("used more than 64 MB of memory" in a.message for a in stopped)


@pytest.mark.parametrize(("text", "size"), [("4G", 4 * 2**30), ("800m", 800 * 2**20), ("1.5K", 1536), ("1000", 1000)])
def test_the_memory_budget_reads_sizes(monkeypatch: pytest.MonkeyPatch, text: str, size: int) -> None:
    monkeypatch.setenv(apart_module.MEMORY_ENV, text)
    assert apart_module.memory_budget() == size


def test_a_malformed_memory_budget_says_how_to_write_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(apart_module.MEMORY_ENV, "lots")
    with pytest.raises(CaptureError, match="FXVIZ_CAPTURE_MEMORY='lots' is not a size: write it as 4G, 800M"):
        apart_module.memory_budget()
    monkeypatch.delenv(apart_module.MEMORY_ENV)
    budget = apart_module.memory_budget()
    assert budget is not None and 0 < budget < os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
