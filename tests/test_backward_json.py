"""A training step's graph as JSON: ``phase`` on nodes and the ``saved`` list round-trip, read and
render without torch, are checked like every other field; graphs saved before either existed read
as forward graphs. And GPT-2 (tiny) on both paths."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import fxviz
from fxviz.errors import GraphFormatError
from fxviz.passes.overlays import overlays
from tests.backward_models import mlp, torch_saved, torch_step
from tests.test_layers import _NO_TORCH, REPO


def test_phase_and_saved_round_trip_and_render_without_torch(tmp_path: Path) -> None:
    model, args = mlp()
    g = fxviz.capture(model, args, backward=True, method="eager")
    text = g.to_json()
    data = json.loads(text)
    assert {n.get("phase", "forward") for n in data["nodes"]} == {"forward", "backward"}
    assert sum(r["bytes"] for r in data["saved"]) == 16_384
    assert {"node", "module", "bytes", "shape", "dtype"} <= set(data["saved"][0])
    back = fxviz.Graph.from_json(text)
    assert back.to_json() == text and back.saved == g.saved
    (tmp_path / "g.json").write_text(text, encoding="utf-8")
    code = _NO_TORCH + f"""
import json, fxviz
from fxviz.passes.overlays import overlays
g = fxviz.Graph.from_json(open({str(tmp_path / "g.json")!r}).read())
o = overlays(g)
print(json.dumps({{"torch": "torch" in __import__("sys").modules, "saved": sum(s.bytes for s in g.saved),
                  "modules": o["saved"]["modules"], "phases": sorted(set(o["phase"]["nodes"].values())),
                  "tree": str(g).count("Backward"), "html": len(g.to_html())}}))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["torch"] is False and out["saved"] == 16_384 and out["tree"] == 6 and out["html"] > 0
    assert out["modules"] == {"a#0": 0, "act#0": 8192, "b#0": 8192}
    assert out["phases"] == ["backward", "forward"]


def test_a_graph_saved_before_phases_reads_as_a_forward_graph() -> None:
    old = {"schema": 1, "name": "Old", "method": "export", "nodes": [
        {"name": "x", "kind": "input", "outputs": [{"shape": [2], "dtype": "float32"}]},
        {"name": "relu", "kind": "op", "target": "aten.relu.default", "inputs": ["x"], "stack": [["act", 0]],
         "outputs": [{"shape": [2], "dtype": "float32"}]},
        {"name": "output", "kind": "output", "target": "output", "inputs": ["relu"]}]}
    g = fxviz.Graph.from_json(json.dumps(old))
    assert [n.phase for n in g.nodes] == ["forward"] * 3 and g.saved == []
    assert "phase" not in overlays(g) and "saved" not in overlays(g)
    assert "phase" not in g.to_json() and "saved" not in json.loads(g.to_json())


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d["nodes"][1].update(phase="sideways"), "'phase': expected one of forward, backward, recompute"),
    (lambda d: d["saved"][0].update(node="nowhere"), "saved\\[0\\] 'node': expected the name of a node"),
    (lambda d: d["saved"][0].update(bytes=-1), "saved\\[0\\] 'bytes'"),
    (lambda d: d["saved"][0].update(shares="borrowed"), "saved\\[0\\] 'shares'"),
])
def test_a_broken_phase_or_saved_record_is_named(change: object, message: str) -> None:
    model, args = mlp()
    d = json.loads(fxviz.capture(model, args, backward=True, method="eager").to_json())
    change(d)  # type: ignore[operator]
    with pytest.raises(GraphFormatError, match=message):
        fxviz.Graph.from_json(json.dumps(d))


@pytest.mark.parametrize("method", ["export", "eager"])
def test_gpt2_tiny_training_step(method: str) -> None:
    from tests.transformers_zoo import gpt2

    model, args, kwargs = gpt2()
    g = fxviz.capture(model, args, kwargs, backward=True, method=method)
    total, fns = torch_step(model, args, kwargs)
    saved = sum(s.bytes for s in g.saved)
    backward = [n for n in g.ops if n.phase == "backward"]
    if method == "eager":  # torch's own record of the step, exactly
        assert saved == total and len(backward) == fns
    else:  # exact but for the causal mask only the traced program builds (inferred, with its reason)
        inferred = [s for s in g.saved if s.inferred]
        assert saved - sum(s.bytes for s in inferred) == total
        assert [(s.module, s.shape, s.dtype) for s in inferred] == [
            (f"transformer.h.{i}.attn", (1, 1, 7, 7), "float32") for i in range(2)]
        assert all("attention mask" in s.reason for s in inferred)
    assert {n.attrs["grad_of"] for n in g.outputs if n.phase == "backward"} == {
        name for name, p in model.named_parameters() if p.requires_grad}
    # every block's attention has backward ops of its own, beside its forward ops
    for i in range(2):
        mine = [n for n in g.ops if n.module.startswith(f"transformer.h.{i}.attn")]
        assert {n.phase for n in mine} == {"forward", "backward"}
    ov = overlays(g)
    top = [c for c in g.calls.root.children]
    assert sum(ov["saved"]["modules"].get(c.id, 0) for c in top) + sum(
        ov["saved"]["nodes"].get(x, 0) for x in g.calls.root.ops) == saved


def _train_gpt2() -> tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]:
    from tests.transformers_zoo import _ids, gpt2

    model, _, _ = gpt2()
    model.config.n_positions = 64
    torch.manual_seed(0)
    from transformers import GPT2LMHeadModel
    model = GPT2LMHeadModel(model.config)
    return model.train(), (_ids(64),), {}


def _train_llama() -> tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]:
    from tests.transformers_zoo import _ids, llama

    model, _, _ = llama()
    ids = _ids(64)
    return model.train(), (), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


@pytest.mark.parametrize("build", [_train_gpt2, _train_llama])
def test_a_decoders_training_step_saves_on_the_export_path_what_torch_packs(build: Any) -> None:
    """GPT-2 and LLaMA in train mode, seq 64: each record the joint graph gives (but the attention
    masks only the traced program builds, inferred with their reason) is a storage torch's
    ``saved_tensors_hooks`` packs in a real step, shape, dtype and bytes, and none is missing: GPT-2's
    dropouts save a float32 noise on the CPU, not native_dropout's bool mask."""
    model, args, kwargs = build()
    g = fxviz.capture(model, args, kwargs, backward=True, method="export")
    torch.manual_seed(1)
    packed, _ = torch_saved(model, args, kwargs)
    exact = [s for s in g.saved if s.bytes and not s.inferred]
    masks = [s for s in g.saved if s.inferred and "attention mask" in s.reason]
    heads = [s for s in g.saved if s.inferred and "repeats" in s.reason]
    kv = model.config.num_key_value_heads if build is _train_llama else 0
    # GPT-2 in train mode attends with dropout, through the math path: nothing there is inferred
    assert len(masks) == (2 if kv else 0) and len(masks + heads) == sum(s.inferred for s in g.saved)
    # what torch packs beyond the exact records: the unrepeated key and value heads eager's GQA sdpa saves
    unrepeated = sorted(((*s.shape[:1], kv, *s.shape[2:]), s.dtype, s.bytes * kv // s.shape[1]) for s in heads)
    rest = list(packed)
    for s in exact:
        rest.remove((s.shape, s.dtype, s.bytes))  # ValueError: a record torch never packed
    assert sorted(rest) == unrepeated and len(heads) == (4 if kv else 0)
    assert sum(s.bytes for s in exact) + sum(b for _, _, b in unrepeated) == sum(b for _, _, b in packed)
    dropouts = [s for s in g.saved if "dropout" in s.reason]
    assert len(dropouts) == (7 if build is _train_gpt2 else 0)
    assert all(s.dtype == "float32" and not s.inferred for s in dropouts)


_FACTORY = '''
import torch
from torch import nn

def build():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 8)), (torch.randn(32, 16),)

def frozen():
    model, args = build()
    return model.requires_grad_(False), args
'''


def test_cli_backward_on_tree_json_and_html(tmp_path: Path) -> None:
    from tests.test_cli import error_line, run

    (tmp_path / "m.py").write_text(_FACTORY, encoding="utf-8")
    target = f"{tmp_path / 'm.py'}:build"
    r = run("tree", target, "--backward", "--method", "eager", "--overlay", "saved")
    assert r.exit_code == 0, r.output
    assert "GeluBackward0" in r.stdout and "8.0 KiB" in r.stdout and "grad of 0.weight" in r.stdout
    r = run("json", target, "--backward", "-o", str(tmp_path / "g.json"))
    assert r.exit_code == 0, r.output
    g = fxviz.Graph.from_json((tmp_path / "g.json").read_text())
    assert g.method == "export (joint)" and sum(s.bytes for s in g.saved) == 16_384
    r = run("html", target, "--backward", "-o", str(tmp_path / "r.html"))
    assert r.exit_code == 0 and (tmp_path / "r.html").stat().st_size > 0
    r = run("tree", f"{tmp_path / 'm.py'}:frozen", "--backward")
    assert r.exit_code == 2 and "no parameter of Sequential requires grad" in error_line(r)
    r = run("tree", str(tmp_path / "g.json"), "--backward")
    assert r.exit_code == 2 and "--backward only applies" in error_line(r)
