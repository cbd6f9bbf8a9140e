"""The CLI, driven through click's CliRunner: exit codes and what the user reads."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from fxviz import Graph
from fxviz.cli import cli

MODEL_FILE = '''
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
    def forward(self, x):
        return torch.relu(self.fc(x))

def build():
    return Net(), (torch.randn(2, 4),)

def bare():
    return Net()

def kw():
    return Net(), (), {"x": torch.randn(5, 4)}

def broken():
    raise ValueError("no config file found")

def not_a_model():
    return {"model": 1}
'''


@pytest.fixture
def model_file(tmp_path: Path) -> str:
    p = tmp_path / "my_model.py"
    p.write_text(MODEL_FILE)
    return str(p)


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def test_tree_of_a_hand_written_file(model_file: str) -> None:
    r = run("tree", f"{model_file}:build")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0].startswith("Net  captured by export")
    assert "fc (Linear)  [2, 4] → [2, 3]  15 params  · linear" in r.output
    assert "relu  → [2, 3]" in r.output


def test_tree_of_a_package_target_with_depth() -> None:
    r = run("tree", "fxviz.examples:transformer", "--depth", "1")
    assert r.exit_code == 0, r.output
    assert "blocks.0-1 ×2 (Block)" in r.output
    assert "… " in r.output and "ln1" not in r.output  # blocks stay closed at depth 1


def test_input_shape_and_kwargs_factories(model_file: str) -> None:
    r = run("tree", f"{model_file}:bare", "--input-shape", "7,4")
    assert r.exit_code == 0, r.output
    assert "[7, 4] → [7, 3]" in r.output
    r = run("tree", f"{model_file}:kw")
    assert r.exit_code == 0, r.output
    assert "▶ x  [5, 4] float32" in r.output


def test_method_option_forces_one_method(model_file: str) -> None:
    r = run("tree", f"{model_file}:build", "--method", "fx")
    assert r.exit_code == 0, r.output
    assert "captured by fx" in r.output


def test_json_round_trips(model_file: str, tmp_path: Path) -> None:
    out = tmp_path / "g.json"
    r = run("json", f"{model_file}:build", "-o", str(out))
    assert r.exit_code == 0, r.output
    g = Graph.from_json(out.read_text())
    assert g.name == "Net" and [n.target for n in g.ops] == ["aten.linear.default", "aten.relu.default"]


@pytest.mark.parametrize(
    ("target", "extra", "message"),
    [
        ("missing.py:build", [], "file 'missing.py' does not exist"),
        ("{file}:nope", [], "has no attribute 'nope'; it defines: Net, bare, broken, build"),
        ("{file}:broken", [], "factory '{file}:broken' raised ValueError: no config file found"),
        ("{file}:not_a_model", [], "returned dict, not a torch.nn.Module"),
        ("{file}:bare", [], "returned a model without inputs: pass --input-shape"),
        ("{file}:bare", ["--input-shape", "2,x4"], "--input-shape '2,x4' is not a list of positive integers"),
        ("{file}:bare", ["--input-shape", "2,5"], "mat1 and mat2 shapes cannot be multiplied"),
        ("{file}:bare", ["--input-shape", "2,4", "--dtype", "floaty"], "--dtype 'floaty' is not a torch dtype"),
        ("no_colon", [], "should be path/to/file.py:factory or package.module:factory"),
        ("no_such_pkg.models:build", [], "cannot import module 'no_such_pkg.models'"),
    ],
    ids=["missing-file", "missing-attr", "factory-raises", "not-a-module", "no-inputs", "bad-shape",
         "model-rejects-shape", "bad-dtype", "no-colon", "missing-module"],
)
def test_bad_input_is_one_clear_line(model_file: str, target: str, extra: list[str], message: str) -> None:
    r = run("tree", target.format(file=model_file), *extra)
    assert r.exit_code != 0
    assert "Traceback" not in r.output
    assert message.format(file=model_file) in r.output
    error_lines = [line for line in r.output.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1


def test_verbose_shows_the_traceback(model_file: str) -> None:
    r = run("tree", f"{model_file}:broken", "--verbose")
    assert r.exit_code == 2
    assert "Traceback" in r.output and "ValueError: no config file found" in r.output


def test_demo_shows_both_examples_and_how_to_go_on() -> None:
    r = run("demo")
    assert r.exit_code == 0, r.output
    assert "CoolCNN  captured by export" in r.output
    assert "TinyTransformer  captured by export" in r.output
    assert "2 parallel branches" in r.output
    assert "fxviz tree path/to/model.py:factory" in r.output
