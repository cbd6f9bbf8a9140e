"""Zoo of models for the eager tracer: the forwards symbolic capture cannot follow, and the ones
that test the tracer's bookkeeping (in-place writes, shared modules, hooks, training mode).

Each entry builds ``(model, args, kwargs)`` with a fixed seed. ``ZOO`` lists them with what the
tests expect: ``replay`` (a deterministic forward the trace must reproduce), ``raises`` and
``tracer_limit``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch._dynamo.exc import TorchDynamoException

Built = tuple[nn.Module, tuple[Any, ...], dict[str, Any]]


class DataDependentIf(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.pos = nn.ReLU()
        self.neg = nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if y.sum() > 0:
            return self.pos(y)
        return self.neg(y)


class DataDependentLoop(nn.Module):
    """Runs its block as many times as the data says (``.item()``)."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
        for _ in range(int(steps.item())):
            x = torch.tanh(self.block(x))
        return x


class Expert(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, 2 * dim)
        self.down = nn.Linear(2 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


class MixtureOfExperts(nn.Module):
    """Top-1 routing: each expert sees only its tokens (``nonzero``, data-dependent shapes)."""

    def __init__(self, dim: int = 8, experts: int = 4) -> None:
        super().__init__()
        self.router = nn.Linear(dim, experts)
        self.experts = nn.ModuleList(Expert(dim) for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = torch.softmax(self.router(x), dim=-1)
        top_w, top_i = weights.max(dim=-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            rows = (top_i == e).nonzero().squeeze(-1)
            if rows.numel() == 0:
                continue
            out[rows] = expert(x[rows]) * top_w[rows, None]
        return out


class InPlace(nn.Module):
    """In-place ops, a write through ``__setitem__`` and a write through a view."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        y.mul_(2)
        y = self.act(y)
        y[:, 0] = -1.0
        row = y[1]
        row.add_(10)  # through a view: readers of y must see it
        return y * 3


class SharedThrice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Linear(8, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(3):
            x = torch.sigmoid(self.shared(x))
        return self.head(x)


class _ClampGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x.clamp(min=0) * 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return grad * (x > 0) * 2


class CustomFunction(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ClampGrad.apply(self.lin(x)) + 1


class Cond(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        return torch.cond(y.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (y,))


class Broken(nn.Module):
    """Raises halfway: ``head`` expects 7 features and gets 8."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
        self.head = nn.Linear(7, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class TrainingBatchNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.bn = nn.BatchNorm1d(8)
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.bn(self.lin(x)))


class WithHooks(nn.Module):
    """The user's own hooks: they must fire once per call and stay registered."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.out = nn.Linear(8, 3)
        self.calls = {"pre": 0, "post": 0}
        self.lin.register_forward_pre_hook(self._pre)
        self.lin.register_forward_hook(self._post)

    def _pre(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        self.calls["pre"] += 1

    def _post(self, module: nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
        self.calls["post"] += 1
        return output * 0.5  # a hook that computes: its op belongs to ``lin``

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.lin(x))


@dataclass
class Summary:
    scores: torch.Tensor
    count: int
    label: str
    extra: None = None


class NonTensorOutputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, *, mask: torch.Tensor) -> dict[str, Any]:
        y = self.lin(x).masked_fill(mask, 0.0)
        return {"summary": Summary(y, y.shape[0], "ok"), "pair": (y.sum(-1), None), "name": "nto"}


class ComplexFFT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.filt = nn.Parameter(torch.randn(9, dtype=torch.complex64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spec = torch.fft.rfft(x, dim=-1) * self.filt
        return torch.fft.irfft(spec, n=x.shape[-1], dim=-1).abs() + spec.angle().mean()


class Residual(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.lin = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.lin(self.norm(x)))


class DeepResidual(nn.Module):
    def __init__(self, layers: int = 300, dim: int = 16) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Residual(dim) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


@dataclass(frozen=True)
class Entry:
    build: Callable[[], Built]
    replay: bool = True  # deterministic: replay must reproduce the outputs
    raises: bool = False
    # the tracer cannot follow it: level -> (what torch raises, message pattern); a limit of the
    # capture method, not an error of the model (torch.cond compiles its branches)
    tracer_limit: Mapping[str, tuple[type[Exception], str]] | None = None


def _seeded(make: Callable[[], Built]) -> Callable[[], Built]:
    def build() -> Built:
        torch.manual_seed(0)
        return make()

    return build


ZOO: dict[str, Entry] = {
    "data_dependent_if": Entry(_seeded(lambda: (DataDependentIf().eval(), (torch.randn(4, 8),), {}))),
    "data_dependent_loop": Entry(_seeded(
        lambda: (DataDependentLoop().eval(), (torch.randn(4, 8), torch.tensor(3)), {}))),
    "mixture_of_experts": Entry(_seeded(lambda: (MixtureOfExperts().eval(), (torch.randn(16, 8),), {}))),
    "in_place": Entry(_seeded(lambda: (InPlace().eval(), (torch.randn(4, 6),), {}))),
    "shared_thrice": Entry(_seeded(lambda: (SharedThrice().eval(), (torch.randn(4, 8),), {}))),
    "custom_function": Entry(_seeded(lambda: (CustomFunction().eval(), (torch.randn(4, 8),), {}))),
    "cond": Entry(_seeded(lambda: (Cond().eval(), (torch.randn(4, 8),), {})), tracer_limit={
        # Dynamo compiles the branches and cannot trace through the recording mode: it inlines the
        # tracer's own code, and which error it meets there depends on what the tracer's
        # process-wide tables hold (in a fresh process: UncapturedHigherOrderOpError, "captured
        # completely with torch.compile"; after an ATen-level try: an InternalTorchDynamoError)
        "function": (TorchDynamoException, ""),
        # a dispatch mode must declare support for higher-order operators; ours does not
        "aten": (NotImplementedError, "no rule registered for HigherOrderOperator cond"),
    }),
    "broken": Entry(_seeded(lambda: (Broken().eval(), (torch.randn(4, 8),), {})), replay=False, raises=True),
    "training_batchnorm": Entry(
        _seeded(lambda: (TrainingBatchNorm().train(), (torch.randn(6, 8),), {})), replay=False),
    "with_hooks": Entry(_seeded(lambda: (WithHooks().eval(), (torch.randn(4, 8),), {}))),
    "non_tensor_outputs": Entry(_seeded(lambda: (
        NonTensorOutputs().eval(), (torch.randn(4, 8),), {"mask": torch.rand(4, 4) > 0.5}))),
    "complex_fft": Entry(_seeded(lambda: (ComplexFFT().eval(), (torch.randn(2, 16),), {}))),
    "deep_residual": Entry(_seeded(lambda: (DeepResidual().eval(), (torch.randn(2, 16),), {}))),
}
