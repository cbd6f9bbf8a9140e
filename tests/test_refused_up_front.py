"""Option combinations that cannot run are refused before any work: no model built, exported,
compiled or run (issue 18 leftovers). Each test makes every entry to that work raise, so a
refusal that comes after it fails the test with that entry's error instead of the refusal."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from click.testing import CliRunner
from torch import nn

import fxviz.analyze.numerics as numerics_mod
from fxviz.analyze.numerics import check_options, numerics
from fxviz.cli import cli
from fxviz.errors import TargetError
from fxviz.torchbridge.training import LossError


class Ran(AssertionError):
    """Work ran that a refusal should have come before."""


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every entry to capture, export, compile and the model's runs raises :class:`Ran`."""
    import fxviz.analyze.pipeline.run as pipeline_run
    import fxviz.targets.factory as factory

    def ran(what: str) -> Any:
        def fail(*_a: Any, **_k: Any) -> Any:
            raise Ran(f"{what} ran before the refusal")
        return fail

    for name in ("run_eager", "export_program", "stage_program", "compiled_errors", "gradient_errors"):
        monkeypatch.setattr(numerics_mod, name, ran(name))
    monkeypatch.setattr(pipeline_run, "pipeline", ran("pipeline"))
    monkeypatch.setattr(factory, "load_factory", ran("the factory"))
    monkeypatch.setattr(torch.export, "export", ran("torch.export.export"))
    monkeypatch.setattr(torch, "compile", ran("torch.compile"))


def _net() -> tuple[nn.Module, tuple[torch.Tensor]]:
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU()), (torch.randn(2, 4),)


@pytest.mark.usefixtures("no_work")
def test_backward_against_a_stage_is_refused_before_the_pipeline_runs() -> None:
    """It was refused by gradient_errors, after the export, the passes and the eager runs (~17 s)."""
    with pytest.raises(TargetError, match=r"--backward compares gradients .* not 'stage:1': leave --backward out"):
        numerics(*_net(), against="stage:1", backward=True)


@pytest.mark.usefixtures("no_work")
@pytest.mark.parametrize(("kw", "match"), [
    ({"against": "stage:5"}, r"stage:5: the pipeline has stages 0 to 1 \(0 export, 1 decompose\)"),
    ({"against": "stage:2", "passes": ["decompose"]}, "stages 0 to 1"),
    ({"against": "stage:x"}, "give stage:N"),
    ({"against": "dtype:int8"}, "give dtype:bfloat16"),
    ({"against": "export:x"}, "export takes no ':' part"),
    ({"against": "export", "passes": ["decompose"]}, "--pass applies to --against stage:N"),
    ({"against": "export", "per_kernel": True}, "use --against compile:inductor"),
    ({"against": "export", "decompositions": {torch.ops.aten.relu.default: torch.relu}}, "decompositions apply to"),
])
def test_every_option_refusal_comes_before_any_work(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(TargetError, match=match):
        numerics(*_net(), **kw)


@pytest.mark.usefixtures("no_work")
def test_backward_of_a_model_with_nothing_to_train_is_refused_before_the_forward_runs() -> None:
    model, args = _net()
    model.requires_grad_(False)
    with pytest.raises(LossError, match="no parameter of Sequential requires grad"):
        numerics(model, args, against="export", backward=True)


def test_check_options_names_the_side() -> None:
    assert check_options("bf16") == ("dtype:bfloat16", "dtype", "bfloat16")
    assert check_options("compile:aot_eager", backward=True, decompositions={1: 2}) == \
        ("compile:aot_eager", "compile", "aot_eager")
    # a PassManager of three passes is three stages after the export
    from tests.pipeline_passes import three_passes
    assert check_options("stage:3", passes=[three_passes()])[1:] == ("stage", "3")
    with pytest.raises(TargetError, match="stages 0 to 3"):
        check_options("stage:4", passes=[three_passes()])


@pytest.mark.usefixtures("no_work")
def test_cli_numerics_refuses_backward_against_a_stage_before_building_the_model() -> None:
    res = CliRunner().invoke(cli, ["numerics", "fxviz.examples:cnn", "--against", "stage:1", "--backward"])
    assert res.exit_code == TargetError.exit_code, res.output
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 1 and "leave --backward out" in lines[0] and "Traceback" not in res.output


@pytest.mark.usefixtures("no_work")
def test_cli_passes_refuses_a_stage_beyond_the_passes_before_exporting() -> None:
    res = CliRunner().invoke(cli, ["passes", "fxviz.examples:cnn", "--stage", "4"])
    assert res.exit_code == TargetError.exit_code and "--stage 4: the pipeline has stages 0 to 1" in res.output, \
        res.output
    res = CliRunner().invoke(cli, ["passes", "fxviz.examples:cnn", "--stage", "0", "--before-after", "x.html"])
    assert res.exit_code == TargetError.exit_code and "stage 0 has no stage before it" in res.output, res.output


@pytest.mark.usefixtures("no_work")
def test_compile_mode_of_another_backend_is_refused_before_any_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused by the recording backend's constructor, after the model was built (CLI) and a lazy
    model's first forward ran (API); now first."""
    import fxviz.analyze.compilemap.run as compile_run
    from fxviz.analyze.compilemap import compile_map

    monkeypatch.setattr(compile_run, "initialised", lambda *_a, **_k: (_ for _ in ()).throw(Ran("initialised")))
    with pytest.raises(TargetError, match="mode 'max-autotune' applies to the inductor backend only"):
        compile_map(*_net(), backend="aot_eager", mode="max-autotune")
    res = CliRunner().invoke(cli, ["compile", "fxviz.examples:cnn", "--backend", "aot_eager", "--mode", "max-autotune"])
    assert res.exit_code == TargetError.exit_code and "--mode max-autotune applies to the inductor backend only" \
        in res.output, res.output
