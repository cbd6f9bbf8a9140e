"""``.pt2`` files (``torch.export.save``) read back as graphs: the same ops, module paths and
classes, shapes, source lines and input/output names as a live capture of the same model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

torch = pytest.importorskip("torch")

import fxviz  # noqa: E402
from fxviz import examples  # noqa: E402
from fxviz.cli import cli  # noqa: E402
from fxviz.errors import TargetError  # noqa: E402
from fxviz.ir import Graph  # noqa: E402
from fxviz.passes import DEFAULT, run_passes  # noqa: E402
from fxviz.symbolic.pt2 import METHOD, graph_from_pt2  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def save(model: Any, args: tuple[Any, ...], path: Path) -> Path:
    torch.export.save(torch.export.export(model, args), str(path))
    return path


def facts(g: Graph) -> dict[str, Any]:
    """What a .pt2 file must give back as a live capture does."""
    producer = {n.name: n for n in g.nodes}
    return {
        "name": g.name,
        "ops": [n.target for n in g.ops],
        "stacks": [n.stack for n in g.ops],
        "shapes": [[o.shape for o in n.outputs] for n in g.ops],
        "sources": [(n.source.file, n.source.line) if n.source else None for n in g.ops],
        "inputs": [(n.name, n.outputs[0].shape) for n in g.inputs],
        "outputs": [(n.name, producer[n.inputs[0].node].outputs[n.inputs[0].index].shape) for n in g.outputs],
        "parameters": sorted(n.target for n in g.nodes if n.kind == "parameter"),
    }


def classes(g: Graph) -> dict[str, tuple[str, str]]:
    """Module path -> (class, qualified class) for every module the graph's nodes call."""
    called = {p for n in g.ops for p, _ in n.stack} | {""}
    return {p: (g.modules[p].cls, g.modules[p].qualname) for p in sorted(called)}


@pytest.fixture(scope="module")
def cnn_pt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model, args = examples.cnn()
    return save(model, args, tmp_path_factory.mktemp("pt2") / "cnn.pt2")


def test_cnn_pt2_matches_a_live_capture(cnn_pt2: Path) -> None:
    model, args = examples.cnn()
    live = fxviz.capture(model, args, method="export")
    g = run_passes(graph_from_pt2(cnn_pt2), DEFAULT)
    assert g.method == METHOD == "export (.pt2)"
    assert [a.method for a in g.attempts] == [METHOD] and g.attempts[0].ok
    assert facts(g) == facts(live)
    assert classes(g) == classes(live)
    assert classes(g)["initial_conv"] == ("Conv2d", "torch.nn.modules.conv.Conv2d")
    assert facts(g)["inputs"] == [("x", (1, 3, 32, 32))]


def test_transformers_pt2_matches_a_live_capture(tmp_path: Path) -> None:
    from tests.transformers_zoo import gpt2

    model, args, _ = gpt2()
    model.config.use_cache = False  # torch.export.export cannot return a DynamicCache; fxviz can
    live = fxviz.capture(model, args, method="export")
    g = run_passes(graph_from_pt2(save(model, args, tmp_path / "gpt2.pt2")), DEFAULT)
    assert facts(g) == facts(live)
    assert classes(g) == classes(live)
    assert classes(g)["transformer.h.0"][0] == "GPT2Block"
    assert facts(g)["outputs"] == [("logits", (1, 7, 96))]
    assert "h.0-1 ×2 (GPT2Block)" in str(g)  # the fold pass finds the repeated blocks as live


def test_outputs_keep_their_pytree_names(tmp_path: Path) -> None:
    class TwoOut(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            return {"double": x * 2, "pair": (x + 1, x - 1)}

    g = graph_from_pt2(save(TwoOut(), (torch.randn(3),), tmp_path / "two.pt2"))
    assert [n.name for n in g.outputs] == ["double", "pair[0]", "pair[1]"]
    assert g.name == "TwoOut"


def test_cli_reads_pt2_files(cnn_pt2: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(cli, ["tree", str(cnn_pt2)])
    assert r.exit_code == 0, r.output
    assert r.output.splitlines()[0] == "CoolCNN  captured by torch.export (.pt2)  ·  269.1K params  ·  15 ops"
    live = runner.invoke(cli, ["tree", "fxviz.examples:cnn"])
    assert r.output.replace("export (.pt2)", "export") == live.output  # the same tree, line for line
    out = tmp_path / "g.json"
    r = runner.invoke(cli, ["json", str(cnn_pt2), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert Graph.from_json(out.read_text()).method == METHOD
    r = runner.invoke(cli, ["html", str(cnn_pt2), "-o", str(tmp_path / "r.html")])
    assert r.exit_code == 0, r.output
    assert "CoolCNN" in (tmp_path / "r.html").read_text()
    r = runner.invoke(cli, ["diff", str(cnn_pt2), str(out)])
    assert r.exit_code == 0, r.output
    assert "no significant differences" in r.output


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "does not exist: give a file written by torch.export.save"),
        (b"not a zip archive", "cannot load '{path}' with torch.export.load"),
    ],
    ids=["missing", "not-a-pt2"],
)
def test_unreadable_pt2_is_a_target_error(tmp_path: Path, content: bytes | None, message: str) -> None:
    path = tmp_path / "model.pt2"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(TargetError) as info:
        graph_from_pt2(path)
    assert message.format(path=path) in str(info.value)
    r = CliRunner().invoke(cli, ["tree", str(path)])
    assert r.exit_code == 2
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: ")


@pytest.mark.slow
def test_pt2_with_a_model_output_loads_in_a_fresh_process(tmp_path: Path) -> None:
    """A ``ModelOutput`` out-spec loads only once transformers registered it; ``fxviz tree
    model.pt2`` in a process that never imported transformers imports the class's module itself."""
    from tests.transformers_zoo import gpt2

    model, args, _ = gpt2()
    model.config.use_cache = False
    path = save(model, args, tmp_path / "gpt2.pt2")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "fxviz", "tree", str(path), "--depth", "1"], capture_output=True,
                          text=True, cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("GPT2LMHeadModel  captured by torch.export (.pt2)")
    assert "◀ logits  [1, 7, 96] float32" in proc.stdout
    assert proc.stderr == ""  # torch's log of the first, failed load is held back
