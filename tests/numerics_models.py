"""Models for the numerics tests (``tests/test_numerics.py``), also CLI targets
(``tests/numerics_models.py:deterministic``): each factory returns ``(model, args)`` built under a
fixed seed."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
    """A residual block: norm, a two-layer MLP with GELU, softmax gating; every op deterministic."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.down(F.gelu(self.up(self.norm(x))))
        return x + h * torch.softmax(h, dim=-1)


class Deterministic(nn.Module):
    def __init__(self, width: int = 16, depth: int = 2) -> None:
        super().__init__()
        self.embed = nn.Linear(8, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


class GeluNet(nn.Module):
    """``fc1 -> gelu -> fc2``: the target of a deliberately wrong decomposition of ``aten.gelu``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def wrong_gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """A "decomposition" of GELU that is plainly wrong (ReLU): what a buggy custom table does."""
    return torch.relu(x)


class Dropped(nn.Module):
    """Dropout between two linears, meant to run in train mode."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.drop = nn.Dropout(0.5)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


def deterministic() -> tuple[nn.Module, tuple[Any, ...]]:
    torch.manual_seed(0)
    return Deterministic().eval(), (torch.randn(2, 5, 8),)


def gelu_net() -> tuple[nn.Module, tuple[Any, ...]]:
    torch.manual_seed(0)
    return GeluNet().eval(), (torch.randn(3, 8),)


def dropped() -> tuple[nn.Module, tuple[Any, ...]]:
    torch.manual_seed(0)
    return Dropped().train(), (torch.randn(4, 8),)
