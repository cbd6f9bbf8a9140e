"""Inputs that do not fit: a wrong ``--input-shape`` says which shape the model's first layer
expects (never a line of click's code), and ``fxviz.capture`` without inputs asks for them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch import nn

import fxviz
from fxviz.cli import cli
from fxviz.errors import CaptureError, InputError, ModelError, TargetError
from tests.cli_models import Net

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def model_file(tmp_path: Path) -> str:
    p = tmp_path / "mistakes.py"
    shutil.copy(REPO / "tests" / "cli_models.py", p)
    return str(p)


def _last(output: str) -> str:
    return output.strip().splitlines()[-1]


# a capture keeps the partial graph (exit 1, the tree of what ran first); numerics has none (exit 2)
@pytest.mark.parametrize(("command", "code"), [("tree", ModelError.exit_code), ("json", ModelError.exit_code),
                                               ("numerics", TargetError.exit_code)])
def test_a_wrong_input_shape_names_the_shape_the_first_layer_expects(model_file: str, command: str, code: int) -> None:
    res = CliRunner().invoke(cli, [command, f"{model_file}:only_linear", "--input-shape", "1,3"])
    assert res.exit_code == code, res.output
    assert _last(res.output).startswith("error: --input-shape 1,3 does not fit Sequential: its first layer 0 "
                                        "(Linear(in_features=10, out_features=4, bias=True)) expects (*, 10), "
                                        "got (1, 3); pass e.g. --input-shape 1,10")
    assert "click" not in res.output and "core.py" not in res.output
    ok = CliRunner().invoke(cli, ["tree", f"{model_file}:only_linear", "--input-shape", "1,10"])  # the suggestion
    assert ok.exit_code == 0 and "0 (Linear)  [1, 10] → [1, 4]" in ok.output


def test_a_wrong_image_shape_names_the_channels(model_file: str) -> None:
    for given, want in (("1,4,8,8", "1,3,8,8"), ("1,3", "1,3,32,32")):
        res = CliRunner().invoke(cli, ["tree", f"{model_file}:only_conv", "-i", given])
        assert res.exit_code == ModelError.exit_code, res.output
        assert "its first layer 0 (Conv2d(3, 8, kernel_size=(3, 3), stride=(1, 1))) expects (N, 3, H, W), " \
               f"got ({given.replace(',', ', ')}); pass e.g. --input-shape {want}" in _last(res.output)
        ok = CliRunner().invoke(cli, ["tree", f"{model_file}:only_conv", "-i", want])
        assert ok.exit_code == 0, ok.output


def test_token_ids_need_an_integer_dtype(model_file: str) -> None:
    res = CliRunner().invoke(cli, ["tree", f"{model_file}:only_embedding", "-i", "1,16"])
    assert res.exit_code == ModelError.exit_code, res.output
    assert _last(res.output).startswith("error: --input-shape 1,16 does not fit Sequential: its first layer 0 "
                                 "(Embedding(20, 4)) takes integer token ids below 20, got torch.float32 values; "
                                 "add --dtype int64")
    ok = CliRunner().invoke(cli, ["tree", f"{model_file}:only_embedding", "-i", "1,16", "--dtype", "int64"])
    assert ok.exit_code == 0, ok.output


def test_a_model_that_raises_for_another_reason_still_says_the_model_raised(model_file: str) -> None:
    res = CliRunner().invoke(cli, ["tree", f"{model_file}:hostile", "-i", "2,4"])
    assert res.exit_code == 1 and "does not fit" not in res.output and "the model raised" in res.output
    res = CliRunner().invoke(cli, ["tree", f"{model_file}:only_linear", "-i", "1,3"])
    assert res.output.startswith("Sequential  captured by the eager tracer (partial)")  # what ran, then the line
    assert _last(res.output).endswith("(the model raised during eager capture: RuntimeError: mat1 and mat2 shapes "
                                      "cannot be multiplied (1x3 and 10x4) in module '0' (Linear))")


def test_a_failed_attempt_points_at_the_models_line_not_its_caller() -> None:
    """fx records each node's innermost user frame; a model of torch layers has none, and the
    frames above fxviz (the CLI, click, this test) are its callers, not its lines."""
    with pytest.raises(CaptureError) as info:
        fxviz.capture(nn.Sequential(nn.Linear(10, 4)), (torch.randn(1, 3),), method="fx")
    assert info.value.attempts[0].source is None
    with pytest.raises(CaptureError) as info:
        fxviz.capture(Net(), (torch.randn(2, 3),), method="fx")
    src = info.value.attempts[0].source
    assert src is not None and src.file.endswith("cli_models.py") and src.code == "return torch.relu(self.fc(x))"


@pytest.mark.parametrize("call", ["capture", "compare", "numerics"])
def test_capture_without_inputs_asks_for_them(call: str) -> None:
    with pytest.raises(InputError) as info:
        getattr(fxviz, call)(nn.Linear(3, 2))
    assert str(info.value) == ("Linear.forward needs input: pass example inputs as torch.export takes them, "
                               "e.g. fxviz.capture(model, (input,)) with input a tensor of the shape it expects")
    assert info.value.__cause__ is None  # asked before forward ran, not a TypeError from inside it


def test_a_layer_further_in_is_not_blamed_on_the_input_shape(model_file: str) -> None:
    """After a Flatten the Linear sees a shape the model made: the model's own error is shown."""
    with open(model_file, "a") as f:
        f.write("\n\ndef flat():\n    return nn.Sequential(nn.Flatten(), nn.Linear(784, 4))\n")
    res = CliRunner().invoke(cli, ["tree", f"{model_file}:flat", "-i", "1,1,28,27"])
    assert res.exit_code == ModelError.exit_code and "does not fit" not in res.output
    assert "mat1 and mat2 shapes cannot be multiplied (1x756 and 784x4)" in _last(res.output)


@pytest.mark.parametrize(("factory", "hint"), [
    ("only_linear", "pass --input-shape 1,10 (its first layer 0 (Linear(in_features=10, out_features=4, bias=True)) "
                    "expects (*, 10))"),
    ("only_conv", "pass --input-shape 1,3,32,32 (its first layer 0 (Conv2d(3, 8, kernel_size=(3, 3), stride=(1, 1))) "
                  "expects (N, 3, H, W))"),
    ("only_embedding", "pass --input-shape 1,16 --dtype int64 (its first layer 0 (Embedding(20, 4)) takes integer "
                       "token ids below 20)"),
])
def test_a_model_without_inputs_is_told_a_shape_that_fits(model_file: str, factory: str, hint: str) -> None:
    res = CliRunner().invoke(cli, ["tree", f"{model_file}:{factory}"])
    assert res.exit_code == TargetError.exit_code
    assert _last(res.output) == (f"error: factory '{model_file}:{factory}' returned a model without inputs: "
                                 f"{hint} or return (model, args) from the factory")
    args = hint.removeprefix("pass ").split(" (")[0].split()
    ok = CliRunner().invoke(cli, ["tree", f"{model_file}:{factory}", *args])  # the hint, as given, runs
    assert ok.exit_code == 0, ok.output


def test_integer_inputs_to_a_float_layer_say_to_drop_the_dtype(model_file: str) -> None:
    res = CliRunner().invoke(cli, ["tree", f"{model_file}:only_linear", "-i", "1,10", "--dtype", "int64"])
    assert res.exit_code == ModelError.exit_code
    assert _last(res.output).startswith(
        "error: --input-shape 1,10 does not fit Sequential: its first layer 0 (Linear(in_features=10, out_features=4, "
        "bias=True)) takes floating-point values, got torch.int64; drop --dtype (float32 is the default)")


def test_input_shapes_are_made_where_the_model_is(tmp_path: Path) -> None:
    """``--input-shape`` makes its tensors on the model's device: a model on ``meta`` (too big to
    load) gets ``meta`` inputs, shapes and all, and the values are those of the CPU draw."""
    from fxviz.targets.factory import make_inputs, model_device

    with torch.device("meta"):
        big = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    assert model_device(big) == torch.device("meta") and model_device(nn.Linear(2, 2)) is None
    (x,) = make_inputs(["2,8"], "float32", model_device(big))
    assert x.device.type == "meta" and tuple(x.shape) == (2, 8)
    assert torch.equal(make_inputs(["2,8"], "float32")[0], make_inputs(["2,8"], "float32", "cpu")[0])
    p = tmp_path / "meta_model.py"
    p.write_text("import torch\nfrom torch import nn\n\ndef build():\n    with torch.device('meta'):\n"
                 "        return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))\n")
    res = CliRunner().invoke(cli, ["json", f"{p}:build", "--input-shape", "2,8"])
    assert res.exit_code == 0, res.output
    import json

    nodes = {n["kind"]: n for n in json.loads(res.output)["nodes"]}
    assert nodes["input"]["outputs"] == [{"shape": [2, 8], "dtype": "float32", "device": "meta"}]
    assert nodes["output"]["outputs"][0]["shape"] == [2, 4]
