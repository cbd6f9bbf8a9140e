"""The stages a long analysis reports (:mod:`fxviz.progress`) and the CLI's progress line: what a
user watching a minute-long ``fxviz compile`` sees is where the run is, in torch's own terms."""

from __future__ import annotations

import io

import pytest
import torch
from rich.console import Console

import fxviz
from fxviz.cli.base import _progress_line
from fxviz.progress import listening, stage
from tests.compile_models import item_break
from tests.models import data_dependent


def test_the_compile_map_reports_each_graph_dynamo_hands_the_backend() -> None:
    """One stage per compiled graph, in the order and with the op count Dynamo's own graphs have
    (``torch._dynamo.explain`` on the same model), between the compiled run and the eager trace."""
    model, args = item_break()
    want = torch._dynamo.explain(model)(*args)
    torch._dynamo.reset()
    seen: list[str] = []
    with listening(seen.append):
        fxviz.compile_map(model, args, backend="aot_eager", inputs=[(torch.randn(4, 8),)])
    compiled = [s for s in seen if s.startswith("compiling graph")]
    ops = [sum(n.op in ("call_function", "call_method", "call_module") for n in g.graph.nodes) for g in want.graphs]
    assert [(s.split()[2], int(s.rsplit(", ", 1)[1].split()[0])) for s in compiled[:want.graph_count]] == [
        (f"g{i}", n) for i, n in enumerate(ops)]
    first = seen.index("running the compiled model, input set 1 of 2")
    second = seen.index("running the compiled model, input set 2 of 2")
    assert first == 0 and first < seen.index(compiled[0]) < second
    assert seen[-2:] == ["tracing the eager forward", "matching the eager ops to the compiled graphs"]


def test_a_capture_reports_each_method_it_tries() -> None:
    model, args, kwargs = data_dependent()
    seen: list[str] = []
    with listening(seen.append):
        g = fxviz.capture(model, args, kwargs)
    tried = [a.method for a in g.attempts if not a.skipped]
    assert len(tried) > 1  # export refuses the branch on a value: the chain goes on
    assert seen == [f"trying {tried[0]}"] + [f"trying {m} ({', '.join(tried[:k])} failed)" for k, m in enumerate(tried[1:], 1)]


def test_the_progress_line_shows_the_stage_reached_and_the_time() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    with _progress_line("compiling with inductor …", console):
        stage("compiling graph g3 (forward, 12 ops)")
    text = out.getvalue()
    assert "compiling with inductor: compiling graph g3 (forward, 12 ops) …" in text and "0:00:0" in text


def test_no_one_listening_costs_nothing_and_says_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[str] = []
    with listening(seen.append):
        stage("heard")
    stage("nobody hears this")  # the listener is gone with its block: no output, no error
    assert seen == ["heard"] and capsys.readouterr() == ("", "")
