"""The model zoo: tiny CPU models, each a factory returning ``(model, args, kwargs)``.

Each model exercises one thing capture must get right: parallel branches (the CNN), a residual add,
attention, keyword inputs, dict and dataclass outputs, one module called twice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fxviz.examples import CoolCNN

Factory = Callable[[], tuple[nn.Module, tuple[Any, ...], dict[str, Any]]]


def cnn() -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
    torch.manual_seed(0)
    return CoolCNN().eval(), (torch.randn(1, 3, 32, 32),), {}


class Residual(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(self.norm(x))))


def residual() -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
    torch.manual_seed(0)
    return Residual().eval(), (torch.randn(2, 5, 16),), {}


class SelfAttention(nn.Module):
    """Multi-head self-attention written out: q/k/v projections run in parallel on the input."""

    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.heads
        q = self.q(x).view(b, t, h, d // h).transpose(1, 2)
        k = self.k(x).view(b, t, h, d // h).transpose(1, 2)
        v = self.v(x).view(b, t, h, d // h).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / (d // h) ** 0.5
        y = att.softmax(dim=-1) @ v
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class AttentionBlock(nn.Module):
    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, heads)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.ReLU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln(x))
        return x + self.mlp(x)


def attention() -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
    torch.manual_seed(0)
    return AttentionBlock().eval(), (torch.randn(2, 6, 16),), {}


class KwargsModel(nn.Module):
    """Takes a positional tensor and keyword inputs, one of them a dict of tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.gate = nn.Linear(8, 8)

    def forward(
        self, x: torch.Tensor, *, mask: torch.Tensor, extra: dict[str, torch.Tensor], scale: float = 1.0
    ) -> torch.Tensor:
        y = self.proj(x) * mask
        return y + torch.sigmoid(self.gate(extra["bias"])) * scale


def kwargs_inputs() -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
    torch.manual_seed(0)
    kwargs = {"mask": torch.ones(3, 8), "extra": {"bias": torch.randn(3, 8)}, "scale": 0.5}
    return KwargsModel().eval(), (torch.randn(3, 8),), kwargs


class DictOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(8, 12)
        self.head_a = nn.Linear(12, 3)
        self.head_b = nn.Linear(12, 5)

    def forward(self, x: torch.Tensor) -> dict[str, Any]:
        h = torch.tanh(self.encoder(x))
        return {"a": self.head_a(h), "b": self.head_b(h), "aux": [h.sum(-1), h.mean()]}


def dict_outputs() -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
    torch.manual_seed(0)
    return DictOut().eval(), (torch.randn(4, 8),), {}


@dataclass
class Prediction:
    logits: torch.Tensor
    hidden: torch.Tensor
    n_classes: int = 6


class DataclassOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.classifier = nn.Linear(16, 6)

    def forward(self, x: torch.Tensor) -> Prediction:
        h = self.body(x)
        return Prediction(self.classifier(h), h)


def dataclass_outputs() -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
    torch.manual_seed(0)
    return DataclassOut().eval(), (torch.randn(2, 8),), {}


class CalledTwice(nn.Module):
    """``shared`` runs twice on one forward, with ``mid`` in between."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Linear(8, 8)
        self.mid = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shared(self.mid(self.shared(x)))


def called_twice() -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
    torch.manual_seed(0)
    return CalledTwice().eval(), (torch.randn(2, 8),), {}


class DataDependent(nn.Module):
    """Branches on a tensor's value: no symbolic method can capture it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        n = int(y.sum().item() > 0) + 1
        return y.repeat(n, 1) if n > 1 else y


def data_dependent() -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
    torch.manual_seed(0)
    return DataDependent().eval(), (torch.randn(2, 4),), {}


#: Models every symbolic method family should capture (name -> factory).
ZOO: dict[str, Factory] = {
    "cnn": cnn,
    "residual": residual,
    "attention": attention,
    "kwargs": kwargs_inputs,
    "dict_out": dict_outputs,
    "dataclass_out": dataclass_outputs,
    "called_twice": called_twice,
}
