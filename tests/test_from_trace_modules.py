"""A plain saved ``TORCH_TRACE`` directory (the user's own run with ``TORCH_TRACE=dir`` and
``backend="aot_eager"``, no fxviz in it) read by ``fxviz compile --from-trace DIR TARGET``: the
module of each AOT forward node the partition names (what the backward saves and recomputes) is
the one torch's ``nn_module_stack`` gives that node. A plain trace prints no module stack, so the
oracle is the same program's AOT forward graph compiled in this process with a backend that keeps
each node's ``nn_module_stack`` (torch names the nodes the same way in both runs)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from fxviz.cli import cli

REPO = Path(__file__).resolve().parent.parent
TARGETS = {"block": "tests/inside_models.py:block", "gpt2": "tests/compile_backward_models.py:gpt2",
           "mlp": "tests/compile_backward_models.py:mlp"}


def _path(qualified: str) -> str:
    """torch's module key (``L['self'].h[0].ln_1``, ``L['self']._modules['a']``) as a module path."""
    text = re.sub(r"^L\['self'\]", "", qualified)
    text = re.sub(r"\._modules\['([^']*)'\]|\['([^']*)'\]|\[(\d+)\]", lambda m: "." + next(g for g in m.groups() if g), text)
    return text.strip(".")


def _torch_modules(target: str) -> dict[str, str]:
    """AOT forward node -> the module path of its innermost ``nn_module_stack`` entry ("" when torch
    gives the node an empty stack: the model's own forward)."""
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified

    from fxviz.targets.factory import load_factory
    from fxviz.targets.parse import recognise

    out: dict[str, str] = {}

    def fw(gm: torch.fx.GraphModule, _ex: Any) -> Any:
        for n in gm.graph.nodes:
            if n.op == "call_function":
                stack = n.meta.get("nn_module_stack") or {}
                out[n.name] = _path(list(stack.values())[-1][0]) if stack else ""
        return make_boxed_func(gm.forward)

    def backend(gm: torch.fx.GraphModule, ex: Any) -> Any:
        return aot_module_simplified(gm, ex, fw_compiler=fw, bw_compiler=lambda g, _e: make_boxed_func(g.forward))

    t = load_factory(recognise(target), input_shapes=(), dtype="float32")
    torch._dynamo.reset()
    try:
        y = torch.compile(t.model, backend=backend)(*t.args, **t.kwargs)
        (y if torch.is_tensor(y) else y[0]).sum().backward()
    finally:
        torch._dynamo.reset()
    return out


@pytest.fixture(scope="module", params=sorted(TARGETS))
def saved(request: Any, tmp_path_factory: Any) -> dict[str, Any]:
    target = TARGETS[request.param]
    path = tmp_path_factory.mktemp("trace")
    file, name = target.split(":")
    script = textwrap.dedent(f"""
        import runpy, torch
        model, args = runpy.run_path({str(REPO / file)!r})[{name!r}]()
        out = torch.compile(model, backend="aot_eager")(*args)
        (out if torch.is_tensor(out) else out[0]).sum().backward()
    """)
    env = {**os.environ, "TORCH_TRACE": str(path), "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = path / "inside.json"
    res = CliRunner().invoke(cli, ["compile", "--from-trace", str(path), target, "--backward", "--json", str(out)])
    assert res.exit_code == 0, res.output
    return {"name": request.param, "inside": json.loads(out.read_text()), "torch": _torch_modules(target)}


def test_each_saved_and_recomputed_nodes_module_is_torchs(saved: dict[str, Any]) -> None:
    truth = saved["torch"]
    graphs = saved["inside"]["inside"]["graphs"]
    compared = 0
    for g in graphs:
        part = g.get("partition") or {}
        rows = [(r["node"], r["module"]) for r in part.get("saved", []) if not r.get("shares")]
        rows += [(r["node"], r["module"]) for r in part.get("recomputed", [])]
        for node, module in rows:
            if node in truth:
                assert module == truth[node], (saved["name"], node, module, truth[node])
                compared += 1
    assert compared >= 3, (saved["name"], compared)
