"""A module call's boundary in a training step is what its forward reads and returns, as torch's
forward hooks see the call. It listed the backward's values too: ``0 (Linear)  [3, 4], [3, 8] →
[8, 4], [8], +1`` (the gradient it is handed, and its parameters' gradients in place of its
output), where the hooks see ``[3, 4] → [3, 8]``; the tree, the report's box panel and
``Call.inputs``/``outputs`` all read that one derivation (:mod:`fxviz.callbounds`)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import fxviz
from fxviz.render.tree import tree_text


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 6), nn.Tanh()), nn.Linear(6, 2))


@pytest.mark.parametrize("method", ["eager", "export"])
def test_a_training_steps_call_boundaries_are_its_forward_hooks(method: str) -> None:
    model, x = _model(), torch.randn(3, 4)
    seen: dict[str, tuple[list[tuple[int, ...]], list[tuple[int, ...]]]] = {}

    def hook(path: str) -> Any:
        def record(_m: nn.Module, args: tuple[Any, ...], out: Any) -> None:
            outs = out if isinstance(out, tuple) else (out,)
            seen[path] = ([tuple(a.shape) for a in args], [tuple(o.shape) for o in outs])
        return record

    handles = [m.register_forward_hook(hook(p)) for p, m in model.named_modules() if p]
    model(x).sum().backward()
    for h in handles:
        h.remove()
    model.zero_grad(set_to_none=True)
    g = fxviz.capture(model, (x,), method=method, backward=True)
    assert any(n.phase == "backward" for n in g.nodes)
    got = {c.path: ([g.meta_of(r).shape for r in c.inputs], [g.meta_of(r).shape for r in c.outputs])
           for c in g.calls.root.walk() if c.path}
    assert got == seen
    assert "0 (Linear)  [3, 4] → [3, 8]" in tree_text(g, width=200)
