"""``fxviz compile --graph/--stage`` and ``fxviz passes --from-stage/--to-stage``: a value that can
name nothing is refused before any work; one the run did not produce is refused, once torch has
compiled, in one line that lists what the run did produce, and that list is torch's own record
of the same run (the structured trace's ``dynamo_output_graph`` and AOT graphs per compile id)."""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from torch._logging._internal import trace_log

from fxviz.cli import cli
from fxviz.errors import TargetError
from tests.test_refused_up_front import no_work  # noqa: F401 - the fixture

MODEL = textwrap.dedent('''
    import torch
    from torch import nn

    class Broken(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            x = self.a(x).relu()
            torch._dynamo.graph_break()
            return self.b(x).sigmoid()

    def build():
        return Broken(), (torch.randn(2, 4),)
''')


class Artifacts(logging.Handler):
    """torch's structured trace of a run: compile id -> the artifacts it recorded, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.by_compile: dict[str, list[str]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        md = record.metadata  # type: ignore[attr-defined]
        if md.get("frame_id") is None:
            return
        cid = f"{md['frame_id']}/{md['frame_compile_id']}" + (f"_{md['attempt']}" if md.get("attempt") else "")
        kind = next((k for k in md if k not in ("frame_id", "frame_compile_id", "attempt", "rank")), None)
        if kind == "artifact":
            kind = md["artifact"]["name"]
        if kind is not None:
            self.by_compile.setdefault(cid, []).append(kind)


def _lines(output: str) -> list[str]:
    return [x for x in output.splitlines() if x.strip()]


@pytest.mark.usefixtures("no_work")
@pytest.mark.parametrize("value", ["foo", "g", "0-0", "graph1"])
def test_a_graph_that_can_name_nothing_is_refused_before_compiling(value: str, tmp_path: Path) -> None:
    """It was refused by the lookup after the whole compile (or the trace's reading and the model's
    eager trace), and printed the map first."""
    for args in (["compile", "fxviz.examples:cnn", "--inside", "--graph", value],
                 ["compile", "--from-trace", str(tmp_path), "fxviz.examples:cnn", "--graph", value]):
        res = CliRunner().invoke(cli, args)
        assert res.exit_code == TargetError.exit_code, res.output
        assert _lines(res.output) == [f"error: --graph {value!r} names no compiled graph: give a graph id (g0, g1, "
                                      "...) or a compile id (0/0, 1/0, ...)"], res.output


@pytest.mark.usefixtures("no_work")
@pytest.mark.parametrize(("args", "match"), [
    (["--from-stage", "2"], "--from-stage 2: the pipeline has stages 0 to 1"),
    (["--to-stage", "5"], "--to-stage 5: the pipeline has stages 0 to 1"),
    (["--from-stage", "1", "--to-stage", "0"], "--from-stage 1 --to-stage 0 shows no stage: give --to-stage 1 or more"),
])
def test_passes_stage_ranges_beyond_the_pipeline_are_refused_before_exporting(args: list[str], match: str) -> None:
    """They were taken silently: a range past the last stage showed no stage at all."""
    res = CliRunner().invoke(cli, ["passes", "fxviz.examples:cnn", *args])
    assert res.exit_code == TargetError.exit_code, res.output
    assert _lines(res.output) == [f"error: {match}"], res.output


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: Any) -> str:
    path = tmp_path_factory.mktemp("model") / "broken.py"
    path.write_text(MODEL)
    return f"{path}:build"


def _run(args: list[str]) -> tuple[Any, Artifacts]:
    h = Artifacts()
    trace_log.addHandler(h)
    try:
        res = CliRunner().invoke(cli, args)
    finally:
        trace_log.removeHandler(h)
    return res, h


def test_a_graph_the_run_did_not_compile_is_one_line_of_torchs_compile_ids(model_file: str) -> None:
    """Refused after the compile (which graphs there are is known only then), but before the map
    was printed (it was printed, then a line listing only the graph ids)."""
    res, torch_record = _run(["compile", model_file, "--backend", "aot_eager", "--inside", "--graph", "g7"])
    assert res.exit_code == TargetError.exit_code, res.output
    compiled = [cid for cid, kinds in torch_record.by_compile.items() if "dynamo_output_graph" in kinds]
    assert len(compiled) == 2  # torch's record: the break splits the forward in two graphs
    valid = ", ".join(f"g{k} ({cid})" for k, cid in enumerate(compiled))
    assert _lines(res.output) == [f"error: --graph g7: the run compiled 2 graphs: {valid}"], res.output
    # every id the line lists, torch's compile ids included, is one --graph takes
    from fxviz.cli.inside import check_graph_syntax

    for cid in [*compiled, "g0", "g1", "rank 1: 0/0", "!0/1/0", "0/1_1"]:
        check_graph_syntax(cid)


def test_a_stage_the_graph_does_not_have_is_one_line_of_torchs_stages(model_file: str) -> None:
    res, torch_record = _run(["compile", model_file, "--backend", "aot_eager", "--inside", "--graph", "g1",
                              "--stage", "9"])
    assert res.exit_code == TargetError.exit_code, res.output
    cid = [c for c, kinds in torch_record.by_compile.items() if "dynamo_output_graph" in kinds][1]
    # torch's record of that compile under no_grad and aot_eager: Dynamo's graph, then AOT's inference graph
    kinds = torch_record.by_compile[cid]
    assert "aot_inference_graph" in kinds and "aot_joint_graph" not in kinds
    assert _lines(res.output) == [f"error: --stage 9: g1 ({cid}) has stages 0 to 1 (0 Dynamo graph, 1 AOT inference "
                                  "graph)"], res.output
    assert torch.is_grad_enabled()
