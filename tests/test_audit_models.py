"""Audit of what fxviz reports on architectures other tests do not use (MoE, encoder-decoder,
vision transformers, state-space, conv nets), each fact checked against torch's own record of the
same model: ``named_parameters``/``named_buffers``. Each test is a discrepancy fxviz had."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fxviz


class UnreadState(nn.Module):
    """A parameter read only on another branch (Dinov2's ``mask_token``), a buffer never read, a
    submodule never called: torch counts them all in the model's parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(4, 4)
        self.mask = nn.Parameter(torch.zeros(4))
        self.register_buffer("b", torch.ones(3))
        self.unused = nn.Linear(2, 2)

        self.masked = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l(x + self.mask if self.masked else x)


def _state(g: fxviz.Graph, kind: str) -> set[str]:
    return {n.target for n in g.nodes if n.kind == kind}


@pytest.mark.parametrize("method", ["export", "export-strict", "fx", "eager"])
def test_every_method_counts_the_parameters_and_buffers_the_run_did_not_read(method: str) -> None:
    m = UnreadState()
    g = fxviz.capture(m, (torch.randn(2, 4),), method=method)
    assert _state(g, "parameter") == {k for k, _ in m.named_parameters()}
    assert _state(g, "buffer") == {k for k, _ in m.named_buffers()}
    assert g.annotations["stats"]["total_params"] == sum(p.numel() for p in m.parameters())
    assert str(g).splitlines()[0].split("·")[1].strip() == "30 params"
    unread = {n.name: n for n in g.nodes if n.target in ("mask", "b", "unused.weight")}
    assert unread["unused.weight"].stack == (("unused", 0),) and unread["mask"].stack == ()
    assert unread["unused.weight"].outputs[0].shape == (2, 2)
    assert not any(r.node in unread for n in g.nodes for r in n.inputs)  # nothing reads them


def test_a_tied_unread_parameter_is_listed_once_under_its_first_owner() -> None:
    m = nn.ModuleDict({"a": nn.Linear(3, 3), "b": nn.Linear(3, 3), "c": nn.Linear(3, 3)})
    m["c"].weight = m["b"].weight

    class Run(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = m

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.m["a"](x)

    r = Run()
    g = fxviz.capture(r, (torch.randn(1, 3),), method="eager")
    assert sorted(_state(g, "parameter")) == sorted(k for k, _ in r.named_parameters())
    assert g.annotations["stats"]["total_params"] == sum(p.numel() for p in r.parameters())


def test_dinov2s_mask_token_counts_on_the_eager_path() -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Dinov2Config(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                    intermediate_size=32, image_size=16, patch_size=8)
    m = transformers.Dinov2Model(cfg).eval()
    g = fxviz.capture(m, (torch.randn(1, 3, 16, 16),), method="eager")
    assert _state(g, "parameter") == {k for k, _ in m.named_parameters()}
    assert g.annotations["stats"]["total_params"] == sum(p.numel() for p in m.parameters())


class ChannelsFirstNorm(nn.Module):
    """A norm that reads its own weight and bias in forward (ConvNext's ``ConvNextLayerNorm``,
    channels first): fx traces through it and reads them with ``get_attr`` nodes."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(c))
        self.bias = nn.Parameter(torch.zeros(c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = x.mean(1, keepdim=True)
        return self.weight[:, None, None] * (x - u) + self.bias[:, None, None]


class NormedConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.norm = ChannelsFirstNorm(4)
        self.scale = nn.Parameter(torch.full((4, 1, 1), 2.0))  # ConvNext's layer_scale_parameter

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * self.norm(self.conv(x))


@pytest.mark.parametrize("method", ["export", "fx", "eager"])
def test_a_parameter_the_forward_reads_itself_is_a_parameter_of_its_module(method: str) -> None:
    m = NormedConv().eval()
    g = fxviz.capture(m, (torch.randn(1, 3, 6, 6),), method=method)
    assert _state(g, "parameter") == {k for k, _ in m.named_parameters()}
    assert _state(g, "constant") == set()
    mods = dict(m.named_modules())
    per_module = g.annotations["stats"]["modules"]
    assert {p: per_module[p]["params"] for p in ("", "conv", "norm")} == \
        {p: sum(t.numel() for t in mods[p].parameters()) for p in ("", "conv", "norm")} == {"": 124, "conv": 112, "norm": 8}
