"""Small models for the training-step tests (``tests/test_backward*.py``) and the oracles they are
checked against: torch's own records of a real step (``saved_tensors_hooks``, the ``grad_fn`` graph)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class MLP(nn.Module):
    """Linear(16,64)-GELU-Linear(64,8): on a 32x16 input autograd saves 16,384 bytes (DESIGN.md)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 64)
        self.act = nn.GELU()
        self.b = nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.act(self.a(x)))


def mlp() -> tuple[nn.Module, tuple[Any, ...]]:
    torch.manual_seed(0)
    return MLP(), (torch.randn(32, 16),)


class Frozen(nn.Module):
    """A frozen embedding-like first layer, a trained head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(8, 16)
        self.head = nn.Linear(16, 4)
        self.stem.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.stem(x)))


class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return 2 * x * g


class SquareAct(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return Square.apply(x)


class Custom(nn.Module):
    """A custom autograd.Function inside a module of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.sq = SquareAct()
        self.out = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.sq(self.lin(x)))


class Branchy(nn.Module):
    """Branches on tensor data: export cannot, the eager path must."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        return y.relu() if y.sum() > 0 else y.sigmoid()


class Failing(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("this backward is broken")


class BadBackward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return Failing.apply(self.lin(x))


def default_loss(out: Any) -> torch.Tensor:
    from fxviz.torchbridge.normalize import flatten_outputs

    leaves = [v for _, v in flatten_outputs(out) if isinstance(v, torch.Tensor) and v.is_floating_point()]
    return sum((v.sum() for v in leaves[1:]), leaves[0].sum())


def torch_saved(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None,
                ) -> tuple[list[tuple[tuple[int, ...], str, int]], torch.Tensor]:
    """(shape, dtype, bytes) of each storage autograd saves in a real step, counted once, no parameter,
    buffer or input, as ``saved_tensors_hooks`` packs them; and the step's loss."""
    own = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers(), *args,
                                                    *(kwargs or {}).values()] if isinstance(t, torch.Tensor)}
    seen: set[int] = set()
    records: list[tuple[tuple[int, ...], str, int]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = t.untyped_storage().data_ptr()
        if key not in own and key not in seen:
            seen.add(key)
            records.append((tuple(t.shape), str(t.dtype).removeprefix("torch."), t.untyped_storage().nbytes()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = default_loss(model(*args, **(kwargs or {})))
    return records, loss


def torch_step(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> tuple[int, int]:
    """(bytes autograd saves, counting each storage once and no parameter, buffer or input; number of
    autograd nodes of the step other than AccumulateGrad) as torch records them for a real step."""
    records, loss = torch_saved(model, args, kwargs)
    total = sum(b for _, _, b in records)
    return total, sum(1 for f in autograd_nodes(loss) if type(f).__name__ != "AccumulateGrad")


def autograd_nodes(out: torch.Tensor) -> set[Any]:
    """Every autograd node ``out``'s backward reaches (torch's own graph of the step)."""
    fns: set[Any] = set()
    todo = [out.grad_fn]
    while todo:
        f = todo.pop()
        if f is None or f in fns:
            continue
        fns.add(f)
        todo += [g for g, _ in f.next_functions]
    return fns


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x))


class Checkpointed(nn.Module):
    """The first block under ``torch.utils.checkpoint``: it saves only its input."""

    def __init__(self) -> None:
        super().__init__()
        self.a = Block()
        self.b = Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        return self.b(checkpoint(self.a, x, use_reentrant=False))


class BatchNormCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))
