"""Models for the compile map: each breaks torch.compile's graph in one known way, at a line the
tests name (``LINES``, found by the marker comment ``# BREAK:name`` or ``# LINE:name`` at the end of
each line, so edits above do not break the tests)."""

from __future__ import annotations

import json
import logging
import zlib
from pathlib import Path
from typing import Any

import torch
from torch import nn

log = logging.getLogger("fxviz.tests.compile_models")


class Scale(nn.Module):
    """Scales by a Python float read from the data: ``.item()`` breaks the graph."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x)
        s = x.abs().mean().item()  # BREAK:item
        return x * s


class ItemBreak(nn.Module):
    """One ``.item()`` break inside ``scale``: two graphs (before and after)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 8)
        self.scale = Scale()
        self.out = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.inp(x))
        x = self.scale(x)  # BREAK:nested
        return self.out(x).tanh()


class PrintBreak(nn.Module):
    """``print`` and a logging call in the forward."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.a(x)
        print("shape", tuple(x.shape))  # BREAK:print
        x = x.relu()
        log.info("after relu")  # BREAK:log
        return self.b(x)


class BranchBreak(nn.Module):
    """``if tensor:`` on a value computed in the forward."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.pos = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.lin(x)
        if x.sum() > -1e9:  # BREAK:branch
            x = self.pos(x)
        return x * 2


class ExtensionBreak(nn.Module):
    """A call into a C extension (zlib) Dynamo cannot trace."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.lin(x).sigmoid()
        salt = zlib.crc32(b"fxviz") % 7  # BREAK:extension
        return x + salt


class BatchSized(nn.Module):
    """Uses its batch size as a Python number: a new batch size recompiles (static shapes first)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) / x.shape[0]


class Clean(nn.Module):
    """No break: one graph, every op compiled."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(8, 16)
        self.l2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(torch.relu(self.l1(x)))


class Block(nn.Module):
    """A block that reads a Python number from its data."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.lin(x)
        s = x.abs().mean().item()  # BREAK:block-item
        return x / (1 + s)


class LoopOfBreaks(nn.Module):
    """Three blocks called in a loop, each breaking on ``.item()``: Dynamo cannot resume inside the
    loop, so the whole outer ``forward`` runs eagerly and only the blocks' own code compiles (the
    pattern of a real model with 137 breaks from ``.item()``)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)  # BREAK:loop
        return self.head(x + 1).tanh()


class LazyScale(nn.Module):
    """Initialises itself on its first call: reads its scale from the first batch (``.item()``,
    which breaks the graph on that call only) and counts its calls in a cache filled on first use.
    A map that ran the model before compiling it would miss the break."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.scale: float | None = None
        self.seen: dict[str, int] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.lin(x)
        if self.scale is None:
            self.scale = x.abs().max().item()  # BREAK:lazy
            self.register_buffer("first", x.detach().clone())
        self.seen["calls"] = self.seen.get("calls", 0) + 1
        return x / self.scale


def _lines() -> dict[str, int]:
    out = {}
    for i, line in enumerate(Path(__file__).read_text().splitlines(), 1):
        for marker in ("# BREAK:", "# LINE:"):
            if marker in line and "def " not in line and "out[" not in line:
                out[line.rsplit(marker, 1)[1].strip()] = i
    return out


#: Marker -> line number in this file.
LINES = _lines()


def x(batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 8, generator=torch.Generator().manual_seed(batch))


def item_break() -> tuple[nn.Module, tuple[Any, ...]]:
    torch.manual_seed(0)
    return ItemBreak().eval(), (x(),)


def clean() -> tuple[nn.Module, tuple[Any, ...]]:
    torch.manual_seed(0)
    return Clean().eval(), (x(),)


def batch_sized() -> tuple[nn.Module, tuple[Any, ...]]:
    torch.manual_seed(0)
    return BatchSized().eval(), (x(2),)


def lazy_scale() -> tuple[nn.Module, tuple[Any, ...]]:
    torch.manual_seed(0)
    return LazyScale().eval(), (x(),)


def eleven_batches() -> list[tuple[torch.Tensor]]:
    """Input sets for ``--inputs``: batch sizes 3 to 12 (after ``batch_sized``'s 2), eleven sizes
    in all: with static shapes each recompiles, until Dynamo's recompile limit (8) stops it."""
    return [(x(b),) for b in range(3, 13)]


def more_batches() -> list[tuple[torch.Tensor]]:
    """Input sets for ``--inputs``: batch sizes 3 and 4 (after the factory's 2)."""
    return [(x(3),), (x(4),)]


class JsonBreak(nn.Module):
    """Serialises a dict holding a tensor's size with ``json.dumps``: Dynamo inlines the standard
    library's encoder and breaks inside it (an object it cannot build), so the innermost frame of the
    break is ``json/encoder.py``, called from the user's line."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.lin(x)
        meta = json.dumps({"rows": x.shape[0], "tag": "fxviz"})  # BREAK:json
        return x * len(meta)


class BatchBranch(nn.Module):
    """Branches on its batch size in Python: under dynamic shapes the graph holds for one side of
    the branch only (a guard on the batch symbol from this line), and a batch size on the other side
    compiles another graph; the feature size is specialised by the linear layer's weight."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.lin(x)
        if x.shape[0] > 4:  # LINE:size-branch
            x = x * 2
        return x / x.shape[0]


def batch_branch() -> tuple[nn.Module, tuple[Any, ...]]:
    torch.manual_seed(0)
    return BatchBranch().eval(), (x(2),)


class BrokenInner(nn.Module):
    """A ``forward`` with ops before a graph break: Dynamo compiles it as a frame of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.lin(x) * 1.5
        print("inner", tuple(x.shape))
        return x + 1


class TwoForwards(nn.Module):
    """Two frames named ``forward`` in one file (this one and :class:`BrokenInner`'s), each with a
    graph; this one branches on its batch size, the inner one does not."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.inner = BrokenInner()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        if x.shape[0] > 5:  # LINE:outer-branch
            h = h * 3
        return self.inner(h).relu()


def two_forwards() -> tuple[nn.Module, list[tuple[torch.Tensor]]]:
    """The model and its input sets: batch 2, 4 (a dynamic batch next), 7 (past the outer branch)."""
    torch.manual_seed(0)
    return TwoForwards().eval(), [(x(2),), (x(4),), (x(7),)]


def wide_batches() -> list[tuple[torch.Tensor]]:
    """Input sets for ``batch_branch``: batch 3 (same side of the branch), 6 (the other side)."""
    return [(x(3),), (x(6),)]


class Act(nn.Module):
    """An expert's activation: a frame of its own once its caller runs eagerly."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)


class Experts(nn.Module):
    """OLMoE's eager experts (transformers' ``OlmoeExperts``): the experts the router hit come from
    ``nonzero`` (a break: its output's shape depends on the data), then a loop over them with a
    branch on a tensor's value (a break inside a loop: Dynamo runs the rest of the function
    eagerly). How often each line runs depends on the routing."""

    def __init__(self, n: int = 4, d: int = 8) -> None:
        super().__init__()
        self.n = n
        self.w = nn.Parameter(torch.randn(n, d, d) * 0.3)
        self.act = Act()

    def forward(self, x: torch.Tensor, index: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x)
        mask = nn.functional.one_hot(index, self.n + 1).permute(2, 1, 0)
        hit = mask.sum(dim=(-1, -2)).gt(0).nonzero()  # BREAK:moe-hit
        for e in hit:
            e = e[0]
            if e == self.n:  # BREAK:moe-branch
                continue
            k, token = torch.where(mask[e])
            h = self.act(x[token] @ self.w[e]) * weights[token, k, None]
            out.index_add_(0, token, h)
        return out


class MoeLayer(nn.Module):
    def __init__(self, d: int = 8, n: int = 4, top: int = 2) -> None:
        super().__init__()
        self.router = nn.Linear(d, n, bias=False)
        self.experts = Experts(n, d)
        self.top = top

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, index = torch.topk(self.router(x).softmax(-1), self.top, dim=-1)
        return x + self.experts(x, index, weights)


class TinyMoe(nn.Module):
    """Two OLMoE-shaped layers called in a loop."""

    def __init__(self, layers: int = 2) -> None:
        super().__init__()
        self.layers = nn.ModuleList(MoeLayer() for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)  # LINE:moe-layers
        return x


def tiny_moe(seed: int = 0, tokens: int = 6) -> tuple[nn.Module, tuple[Any, ...]]:
    torch.manual_seed(seed)
    return TinyMoe().eval(), (torch.randn(tokens, 8),)


class Widths(nn.Module):
    """Layers of different widths in a loop, each output through one ``act``: the graph break in
    the loop makes Dynamo run ``forward`` eagerly, so ``act`` is a frame of its own that each layer
    calls with a new width. With static shapes it recompiles once per new width, in one input set;
    under automatic dynamic shapes the first recompile makes the width dynamic."""

    def __init__(self, widths: tuple[int, ...] = (6, 10, 3)) -> None:
        super().__init__()
        dims = (4, *widths)
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, dims[1:], strict=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = self.act(layer(x))
            torch._dynamo.graph_break()  # BREAK:widths
        return x

    def act(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x) / x.shape[-1]


def widths(widths: tuple[int, ...] = (6, 10, 3)) -> tuple[nn.Module, tuple[Any, ...]]:
    torch.manual_seed(0)
    return Widths(widths).eval(), (torch.randn(2, 4),)


class TwoBatchSized(nn.Module):
    """Two ``BatchSized`` blocks with a break between: the outer ``forward`` and the function Dynamo
    resumes in after the break each recompile on a new batch size."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = BatchSized(), BatchSized()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.a(x)
        torch._dynamo.graph_break()  # BREAK:two-batch-sized
        return self.b(x)


def two_batch_sized() -> tuple[nn.Module, tuple[Any, ...]]:
    torch.manual_seed(0)
    return TwoBatchSized().eval(), (x(2),)


def olmoe(tokens: int = 8) -> tuple[nn.Module, tuple[Any, ...]]:
    """A tiny OLMoE (transformers, random weights, nothing downloaded): 2 layers of 4 experts, top-2,
    with the eager experts, whose activation module is called once per expert with the tokens the
    router sent it."""
    from transformers import OlmoeConfig, OlmoeForCausalLM

    torch.manual_seed(0)
    cfg = OlmoeConfig(vocab_size=64, hidden_size=16, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, max_position_embeddings=32,
                      eos_token_id=None, pad_token_id=None, bos_token_id=None)
    cfg._experts_implementation = "eager"
    return OlmoeForCausalLM(cfg).eval(), (torch.randint(0, 64, (1, tokens)),)
