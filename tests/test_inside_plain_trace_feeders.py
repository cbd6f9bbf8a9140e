"""A plain ``TORCH_TRACE`` (no provenance tracking) of a patch embedding (CLIP's vision tower:
``Conv2d(3, hidden, patch, stride=patch, bias=False)``): Inductor writes a kernel,
``cpp_fused_convolution_0``, that only copies the image and the weight into the layout the
``extern_kernels.convolution`` after it reads. It showed no op and no module; torch's provenance
record gives it the convolution (``cppCodeToPost``). Its modules are checked against torch's
``nn_module_stack`` of the same program's post-grad nodes (a custom post-grad pass)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from fxviz.analyze.inside.saved import from_trace  # noqa: E402
from fxviz.fallback.trace import trace_eager  # noqa: E402
from tests.test_inside_plain_trace_layers import _path, plain_trace, post_grad  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


class Patches(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, 32, 8, stride=8, bias=False)
        self.norm = nn.LayerNorm(32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.patch(x).flatten(2).transpose(1, 2))


def build() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return Patches().eval(), (torch.randn(1, 3, 32, 32),)


def _torch_modules() -> dict[str, str]:
    out: dict[str, str] = {}

    def record(g: Any) -> None:
        for n in g.nodes:
            stack = n.meta.get("nn_module_stack") or {}
            if n.op == "call_function" and stack:
                out[n.name] = _path(list(stack.values())[-1][0])

    post_grad(build, record)
    return out


def test_a_kernel_that_lays_out_a_convolutions_inputs_has_its_module(tmp_path: Path) -> None:
    plain_trace(tmp_path, "tests.test_inside_plain_trace_feeders")
    truth = _torch_modules()
    assert truth.get("convolution") == "patch"
    model, args = build()
    inside, _ = from_trace(tmp_path, trace_eager(model, args, None, level="function"))
    generated = [k for k in inside.kernels if k.calls and not k.name.startswith(("extern_kernels.", "torch.ops."))]
    assert any("convolution" in k.name for k in generated)  # the layout kernel this is about
    for k in generated:
        mods = {truth[op] for op in k.ops if op in truth}
        assert mods and set(k.modules) >= mods, (k.id, k.ops, k.modules)
    conv = next(k for k in generated if "convolution" in k.name)
    assert conv.ops == ["convolution"] and "patch" in conv.modules
