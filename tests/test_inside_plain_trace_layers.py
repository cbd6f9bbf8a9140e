"""A plain ``TORCH_TRACE`` of an Inductor inference compile (no provenance tracking: each post-grad
node's origin is inferred from its user line) of a model whose layers share their source lines: each
kernel's modules are the ones torch's own ``nn_module_stack`` gives the post-grad nodes it runs
(read in this process from the same program's post-grad graph, a custom post-grad pass). The
inference graph's parameters tell the layers apart as the backward's did; every per-layer kernel
was drawn on both layers (CLIP: ``cpp_fused_mul_sigmoid_view_3`` in layer 0 listed layers 0 and 1)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from fxviz.analyze.inside.saved import from_trace  # noqa: E402
from fxviz.fallback.trace import trace_eager  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.sigmoid(self.fc(self.ln(x)))  # one line, run by every block


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x


def build() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return Stack().eval(), (torch.randn(4, 16),)


def _path(qualified: str) -> str:
    text = re.sub(r"^L\['self'\]", "", qualified)
    text = re.sub(r"\._modules\['([^']*)'\]|\['([^']*)'\]|\[(\d+)\]",
                  lambda m: "." + next(g for g in m.groups() if g), text)
    return text.strip(".")


def _block(module: str) -> set[str]:
    return {module.split(".")[1]} if module.startswith("blocks.") else set()


def _torch_modules() -> tuple[dict[str, str], dict[str, set[str]]]:
    """Post-grad node -> the module of its innermost ``nn_module_stack`` entry, as torch keeps it;
    and node -> the blocks of the values it reads, where they are two (the residual add of block 1
    reads block 0's output: what a node reads cannot say its block, so both are allowed there)."""
    out: dict[str, str] = {}
    mixed: dict[str, set[str]] = {}

    def record(g: Any) -> None:
        for n in g.nodes:
            stack = n.meta.get("nn_module_stack") or {}
            if n.op == "call_function" and stack:
                out[n.name] = _path(list(stack.values())[-1][0])
                read = {b for a in n.all_input_nodes if a.name in out for b in _block(out[a.name])}
                if len(read) > 1:
                    mixed[n.name] = read

    post_grad(build, record)
    return out, mixed


def post_grad(build: Any, record: Any) -> None:
    """Compile ``build()``'s model with Inductor (caches off), handing each post-grad graph to ``record``."""
    import torch._inductor.config as cfg

    model, args = build()
    torch._dynamo.reset()
    try:
        with cfg.patch(post_grad_custom_post_pass=record, fx_graph_cache=False), torch.no_grad():
            torch.compile(model)(*args)
    finally:
        torch._dynamo.reset()


def plain_trace(directory: Path, module: str) -> None:
    """A plain ``TORCH_TRACE`` of ``torch.compile`` on ``module``'s ``build()``, written to
    ``directory`` by a process of its own, as a user's run writes one."""
    script = textwrap.dedent(f"""
        import torch, torch._inductor.config as cfg
        from {module} import build
        model, args = build()
        with cfg.patch(fx_graph_cache=False), torch.no_grad():
            torch.compile(model)(*args)
    """)
    env = {**os.environ, "TORCH_TRACE": str(directory), "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_each_kernels_modules_are_torchs_in_a_plain_trace(tmp_path: Path) -> None:
    plain_trace(tmp_path, "tests.test_inside_plain_trace_layers")
    truth, mixed = _torch_modules()
    model, args = build()
    eager = trace_eager(model, args, None, level="function")
    inside, _ = from_trace(tmp_path, eager)
    compared = exact = 0
    for k in inside.kernels:
        mods = {truth[op] for op in k.ops if op in truth}
        if not mods:
            continue
        drawn = {b for m in k.modules for b in _block(m)}
        torchs = {b for m in mods for b in _block(m)}
        allowed = torchs | {b for op in k.ops for b in mixed.get(op, ())}
        assert torchs <= drawn <= allowed, (k.id, k.ops, k.modules, mods)
        exact += not any(op in mixed for op in k.ops)
        assert set(k.modules) >= mods, (k.id, k.modules, mods)
        compared += 1
    assert compared >= 4 and exact >= 3
