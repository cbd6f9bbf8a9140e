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


def gpt2() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A 2-layer GPT-2 of width 32 from its config (dropout off: the same graph every run)."""
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=16, vocab_size=64, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                                     eos_token_id=0)
    return transformers.GPT2Model(config), (torch.randint(0, 64, (1, 8)),)


class _Block(nn.Module):
    """One line runs three modules (``norm``, ``act``, ``fc``), and every block runs it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.act = nn.GELU()
        self.norm = nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.act(self.fc(x)))


class Shared(nn.Module):
    """Three blocks on one line each (a loop), their lines shared too: a line says nothing of the module."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Block() for _ in range(3))
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def shared() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return Shared(), (torch.randn(4, 16),)
