"""Tiny models for the compiled-backward tests (``fxviz compile --backward``,
tests/test_compile_backward.py): each compiles in about a second with AOT Autograd on CPU."""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    """Two Linear layers around pointwise ops the min-cut partitioner may save or recompute."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 64)
        self.fc2 = nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.fc1(x))
        return self.fc2(torch.tanh(h) * h)


def mlp() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return MLP(), (torch.randn(4, 16),)
