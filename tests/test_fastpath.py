"""torch's fused fast paths (``nn.TransformerEncoderLayer``, ``nn.MultiheadAttention`` in eval mode
under no_grad): no capture can take them, so the graph says where a plain run would."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import fxviz


class _Ops(TorchDispatchMode):
    """torch's own record of a plain run: every ATen op it dispatched."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _encoder() -> nn.Module:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)


def _plain(model: nn.Module, *args: Any) -> list[str]:
    with torch.no_grad(), _Ops() as rec:
        model(*args)
    return rec.ops


@pytest.mark.parametrize("method", ["eager", "export"])
def test_a_fast_path_a_plain_run_takes_is_named_in_the_notes(method: str) -> None:
    model, x = _encoder().eval(), torch.randn(2, 5, 16)
    fused = [op for op in _plain(model, x) if op == "_transformer_encoder_layer_fwd"]
    assert len(fused) == 2  # torch's record: each layer is one fused op in a plain run
    before = {k: v.clone() for k, v in model.state_dict().items()}
    g = fxviz.capture(model, (x,), method=method)
    assert not any("_transformer_encoder_layer_fwd" in n.target for n in g.ops)  # the premise
    notes = [n for n in g.notes if n.startswith("fast path:")]
    assert len(notes) == 1 and f"{len(fused)} module(s)" in notes[0], g.notes
    assert "(layers.0, layers.1: aten._transformer_encoder_layer_fwd)" in notes[0]
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_attention_alone_is_named_at_the_model() -> None:
    model, x = nn.MultiheadAttention(16, 2, batch_first=True).eval(), torch.randn(2, 5, 16)
    assert "_native_multi_head_attention" in _plain(model, x, x, x)  # torch's record
    g = fxviz.capture(model, (x, x, x), method="eager")
    assert any("((the model): aten._native_multi_head_attention)" in n for n in g.notes), g.notes


def test_no_note_where_a_plain_run_takes_no_fast_path() -> None:
    model, x = _encoder().train(), torch.randn(2, 5, 16)
    assert not any(op.startswith(("_transformer_encoder", "_native_multi")) for op in _plain(model, x))
    g = fxviz.capture(model, (x,), method="eager")
    assert not any(n.startswith("fast path:") for n in g.notes)


def test_a_model_without_fast_paths_is_not_run_again() -> None:
    calls: list[int] = []
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    model.register_forward_pre_hook(lambda m, a: calls.append(1))
    fxviz.capture(model, (torch.randn(2, 4),), method="eager")
    assert calls == [1]
