"""``--pass`` and ``--decompose-table`` take ``file.py:name`` as a target takes its factory (before:
"cannot import '/x/p.py' ... No module named '/x/p'"); the stage the file's pass makes is the
graph torch's own run of that pass on the exported program makes."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import torch
from click.testing import CliRunner

from fxviz.cli import cli
from fxviz.examples import cnn

PASS = '''
import torch

def relu_to_clamp(gm):
    for n in list(gm.graph.nodes):
        if n.target is torch.ops.aten.relu.default:
            n.target = torch.ops.aten.clamp_min.default
            n.args = (n.args[0], 0.0)
    gm.recompile()
    return gm
'''


def test_a_pass_from_a_file_runs_as_torch_runs_it(tmp_path: Path) -> None:
    f = tmp_path / "my_passes.py"
    f.write_text(PASS)
    r = CliRunner().invoke(cli, ["passes", "fxviz.examples:cnn", "--pass", f"{f}:relu_to_clamp", "--json", "-"])
    assert r.exit_code == 0, r.output
    stages = json.loads(r.output[r.output.index("{"):])["stages"]
    # torch's own record: the exported program, the same pass run on its graph module
    model, args = cnn()
    gm = torch.export.export(model, args).graph_module
    before = Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
    ns: dict[str, object] = {}
    exec(PASS, ns)  # noqa: S102 - the pass the file defines
    after = Counter(str(n.target) for n in ns["relu_to_clamp"](gm).graph.nodes if n.op == "call_function")  # type: ignore[operator]
    assert stages[1]["ops_before"] == dict(before) and stages[1]["ops_after"] == dict(after)
    assert after["aten.clamp_min.default"] == before["aten.relu.default"] > 0


def test_a_missing_name_in_a_pass_file_is_one_line(tmp_path: Path) -> None:
    f = tmp_path / "my_passes.py"
    f.write_text(PASS)
    r = CliRunner().invoke(cli, ["passes", "fxviz.examples:cnn", "--pass", f"{f}:nothere"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert r.output.strip().splitlines()[-1] == f"error: '{f}' has no attribute 'nothere' (for --pass '{f}:nothere')"
