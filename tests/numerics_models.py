"""Models for the numerics tests (``tests/test_numerics.py``), also CLI targets
(``tests/numerics_models.py:deterministic``): each factory returns ``(model, args)`` built under a
fixed seed."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from tests.numerics_ops import jitter


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


class TinyMoE(nn.Module):
    """Mixture-of-experts routing as MoE language models write it, with static shapes (Dynamo
    compiles it whole): each token's top-2 of 4 experts; the (token, expert) slots are sorted by
    expert and put back through an inverse permutation made with ``torch.empty_like`` and slice
    assignment; the slots' outputs are added into a buffer made with ``new_empty`` and zeroed
    (``index_add_``), which ``index_copy_`` copies into another ``torch.empty_like``. Every value an
    empty op makes is written before it is read."""

    def __init__(self, width: int = 16, experts: int = 4) -> None:
        super().__init__()
        self.router = nn.Linear(width, experts, bias=False)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))
                                     for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        n = tokens.shape[0]
        weights, chosen = torch.topk(torch.softmax(self.router(tokens), dim=-1), 2, dim=-1)
        expert_of, token_of = chosen.reshape(-1), torch.arange(n).repeat_interleave(2)
        perm = torch.argsort(expert_of, stable=True)
        inverse = torch.empty_like(perm)
        inverse[perm] = torch.arange(perm.numel())
        sorted_tokens = tokens[token_of[perm]]
        every = torch.stack([expert(sorted_tokens) for expert in self.experts])
        slots = every[expert_of[perm], torch.arange(2 * n)][inverse] * weights.reshape(-1, 1)
        acc = tokens.new_empty(tokens.shape)
        acc.zero_()
        acc.index_add_(0, token_of, slots)
        out = torch.empty_like(acc)
        out.index_copy_(0, torch.arange(n), acc)
        return out.reshape(x.shape) + x


def tiny_moe() -> tuple[nn.Module, tuple[Any, ...]]:
    torch.manual_seed(0)
    return TinyMoE().eval(), (torch.randn(2, 6, 16),)


class ExpertRows(nn.Module):
    """MoE routing that fills its output expert by expert: ``out = torch.empty_like(x)``, then
    ``out[rows] = expert(x[rows])`` for each expert, so until the last expert has written, part of
    ``out`` is memory nobody wrote: here memory just freed that held 1e30, as a real run's
    allocator hands back whatever the block held."""

    def __init__(self, width: int = 16, experts: int = 3) -> None:
        super().__init__()
        self.router = nn.Linear(width, experts)
        self.experts = nn.ModuleList(nn.Linear(width, width) for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        top = self.router(x).argmax(-1)
        junk = torch.full_like(x, 1e30)
        del junk
        out = torch.empty_like(x)
        for i, expert in enumerate(self.experts):
            rows = (top == i).nonzero().squeeze(-1)
            out[rows] = expert(x[rows])
        return out


def expert_rows() -> tuple[nn.Module, tuple[Any, ...]]:
    torch.manual_seed(0)
    return ExpertRows().eval(), (torch.randn(24, 16),)


def qwen2_moe() -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
    """A tiny Qwen2-MoE (transformers, random weights, nothing downloaded): its experts sort tokens
    and put them back through ``torch.empty_like`` and slice assignment."""
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2MoeConfig(vocab_size=96, hidden_size=32, intermediate_size=64, moe_intermediate_size=32,
                         shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return Qwen2MoeForCausalLM(cfg).eval(), (torch.randint(0, 96, (1, 7)),), {}


def modernbert() -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
    """A tiny ModernBERT (transformers, random weights): one full-attention and one sliding-window
    layer, whose rotary embeddings it computes iterating ``set(layer_types)``, whose order follows
    the strings' hashes (``PYTHONHASHSEED``) in CPython and insertion order under Dynamo."""
    from transformers import ModernBertConfig, ModernBertModel

    torch.manual_seed(0)
    cfg = ModernBertConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, max_position_embeddings=64, global_attn_every_n_layers=2,
                           local_attention=16, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1,
                           sep_token_id=2)
    return ModernBertModel(cfg).eval(), (torch.randint(0, 96, (1, 7)),), {}


class Rotary(nn.Module):
    """cos of the positions times one of two frequency buffers, chosen by name."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("f1", torch.tensor([1.0, 2.0, 0.5, 0.25]))
        self.register_buffer("f3", torch.tensor([3.0, 5.0, 7.0, 0.125]))

    def forward(self, x: torch.Tensor, kind: int) -> torch.Tensor:
        return torch.cos(x * getattr(self, f"f{kind}"))


class SetOrder(nn.Module):
    """ModernBERT's pattern, deterministic: ``for k in set([3, 1])`` runs 1 then 3 in CPython (small
    ints hash to themselves) and 3 then 1 under Dynamo (a set traced in insertion order), so the
    two calls of ``rot`` come in opposite orders on the two sides."""

    def __init__(self) -> None:
        super().__init__()
        self.rot = Rotary()
        self.kinds = [3, 1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = {}
        for k in set(self.kinds):
            out[k] = self.rot(x, k)
        return out[1] + 2 * out[3]


def set_order() -> tuple[nn.Module, tuple[Any, ...]]:
    torch.manual_seed(0)
    return SetOrder().eval(), (torch.randn(3, 4),)


class Jittery(nn.Module):
    """``fc1 -> jitter -> fc2``: every value from jitter on differs between two eager runs."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(jitter(self.fc1(x))))


def jittery() -> tuple[nn.Module, tuple[Any, ...]]:
    torch.manual_seed(0)
    return Jittery().eval(), (torch.randn(3, 8),)


def gemma2() -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
    """A tiny Gemma2 (transformers, random weights): a full and a sliding-window attention mask,
    built from ``and_masks(causal, padding)`` under Dynamo and export but not eagerly, and
    ``repeat_kv`` of the key and the value on one line."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    cfg = Gemma2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=4,
                       max_position_embeddings=64)
    cfg._attn_implementation = "eager"
    return Gemma2ForCausalLM(cfg).eval(), (torch.randint(0, 96, (1, 8)),), {"use_cache": False}
