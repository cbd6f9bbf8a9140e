"""Built-in example models: what ``fxviz demo`` shows, and a template for your own factory.

A factory returns a model, ``(model, args)`` or ``(model, args, kwargs)``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class CoolCNN(nn.Module):
    """Two convolution paths that run in parallel on the input and join at an average."""

    def __init__(self) -> None:
        super().__init__()
        self.initial_conv = nn.Conv2d(3, 16, 3, padding=1)
        self.parallel_conv = nn.Conv2d(3, 16, 3, padding=1)
        self.secondary_conv = nn.Conv2d(16, 32, 3, padding=1)
        self.max_pool = nn.MaxPool2d(2, 2)
        self.fully_connected1 = nn.Linear(32 * 8 * 8, 128)
        self.output_layer = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        main_path = self.max_pool(torch.relu(self.initial_conv(x)))
        parallel_path = self.max_pool(torch.relu(self.parallel_conv(x)))
        x = (main_path + parallel_path) / 2
        x = self.max_pool(torch.relu(self.secondary_conv(x)))
        x = x.view(-1, 32 * 8 * 8)
        x = torch.relu(self.fully_connected1(x))
        return self.output_layer(x)


def cnn() -> tuple[nn.Module, tuple[Any, ...]]:
    """The two-branch CNN on one 32x32 RGB image."""
    torch.manual_seed(0)
    return CoolCNN().eval(), (torch.randn(1, 3, 32, 32),)


class TinyTransformer(nn.Module):
    """A small pre-norm transformer encoder written out by hand: embedding, N blocks, head."""

    def __init__(self, vocab: int = 100, dim: int = 32, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (p(x).view(b, t, self.heads, d // self.heads).transpose(1, 2) for p in (self.q, self.k, self.v))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


def transformer() -> tuple[nn.Module, tuple[Any, ...]]:
    """A 2-block transformer on a batch of 8 token ids."""
    torch.manual_seed(0)
    return TinyTransformer().eval(), (torch.randint(0, 100, (1, 8)),)


EXAMPLES = {"cnn": cnn, "transformer": transformer}
