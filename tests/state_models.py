"""Models whose forward changes things: the model's state, its Python attributes, the inputs, the
process. Each is a scenario for the state harness (``tests/statecheck.py``): whatever the forward
does, a capture by any method must leave everything as it found it.

``SCENARIOS`` maps a name to a builder of ``(model, args, kwargs)`` with a fixed seed.
"""

from __future__ import annotations

import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

Built = tuple[nn.Module, tuple[Any, ...], dict[str, Any]]

_GLOBAL_SCALE = torch.tensor([0.5, 2.0, 1.0, 3.0])  # a tensor the model does not own


class BatchNormNoMomentum(nn.Module):
    """Train-mode BatchNorm with ``momentum=None`` (a cumulative average): its forward bumps
    ``num_batches_tracked`` in Python and divides by it."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4, momentum=None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.lin(x))


class StepCounter(nn.Module):
    """Counts its calls in a buffer, then branches on the data: export and fx fail after the
    write, so ``auto`` reaches the eager tracer with the buffer already written."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.steps.add_(1)
        y = self.lin(x)
        if y.sum() > 0:
            return y.relu()
        return y.tanh()


class PythonCache(nn.Module):
    """Keeps results in a dict keyed by a size: under fx the key is a Proxy."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.cache: dict[Any, Any] = {}
        self.history: list[Any] = []
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        self.cache[x.shape[0]] = y
        self.history.append(y.shape)
        self.calls += 1
        self.last = y
        return y * 2


class RebindBuffer(nn.Module):
    """An exponential moving average kept by rebinding a registered buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("ema", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        self.ema = self.ema * 0.9 + y.mean(0).detach() * 0.1
        return y - self.ema


class TensorConstant(nn.Module):
    """Reads a global tensor and makes one: fx stows such constants on the model
    (``_tensor_constant0``)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * _GLOBAL_SCALE + torch.tensor(1.0)


class BackwardInForward(nn.Module):
    """Takes a gradient inside its forward (a meta-learning inner step): ``.grad`` is filled, or
    accumulated into when the user already has gradients."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():
            loss = (self.lin(x) ** 2).sum()
            loss.backward()
        return self.lin(x)


class MomentumUpdate(nn.Module):
    """MoCo's key encoder: its parameters follow the query encoder's, by ``.data`` rebinding, by an
    in-place write through ``.data``, and by ``lerp_`` under ``no_grad``."""

    def __init__(self) -> None:
        super().__init__()
        self.query = nn.Linear(4, 4)
        self.key = nn.Linear(4, 4)
        self.extra = nn.Linear(4, 4)
        for p in self.key.parameters():
            p.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.query(x)
        self.key.weight.data = self.key.weight.data * 0.5 + self.query.weight.data * 0.5
        self.key.bias.data.mul_(0.5).add_(self.query.bias.data, alpha=0.5)
        with torch.no_grad():
            self.extra.weight.lerp_(self.query.weight, 0.5)
        return q + self.key(x) + self.extra(x)


class RebindToOwnView(nn.Module):
    """Rebinds a parameter and a buffer to views of their own elements (``.data = .data.t()``): the
    data pointer stays where it was while the strides, the sizes or the dtype move."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.spare = nn.Parameter(torch.randn(6))
        self.register_buffer("scale", torch.randn(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.lin.weight.data = self.lin.weight.data.t()  # strides
        self.spare.data = self.spare.data[:3]  # sizes
        self.scale.data = self.scale.data.view(torch.int32)  # dtype
        return self.lin(x)


class InputInPlace(nn.Module):
    """Writes its input in place, and an input nested in a dict."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, extra: dict[str, torch.Tensor]) -> torch.Tensor:
        x.add_(1)
        extra["bias"].mul_(2)
        return self.lin(x) + extra["bias"]


class RebindModules(nn.Module):
    """Replaces a parameter, a submodule and registers a buffer from inside its forward."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.act = nn.ReLU()
        self.scale = nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act(self.lin(x)) * self.scale
        self.scale = nn.Parameter(self.scale.detach() * 2)
        self.act = nn.Tanh()
        self.register_buffer("seen", torch.ones(1))
        self.training = not self.training
        return y


class Chatty(nn.Module):
    """Prints to stdout and stderr and warns, as a model's own diagnostics do."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        print("chatty: to stdout")
        print("chatty: to stderr", file=sys.stderr)
        warnings.warn("chatty: a warning of the model's own", UserWarning, stacklevel=1)
        return self.lin(x)


class TrainDropout(nn.Module):
    """Train-mode dropout draws random numbers: the process's random state moves."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.lin(x)) + torch.rand(4)


class WorkerThread(nn.Module):
    """Runs one submodule in a worker thread while the main thread runs another."""

    def __init__(self) -> None:
        super().__init__()
        self.main = nn.Linear(4, 4)
        self.worker = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        box: dict[str, torch.Tensor] = {}
        t = threading.Thread(target=lambda: box.update(out=self.worker(x)))
        t.start()
        y = self.main(x)
        t.join()
        return y + box["out"]


class DeepOutput(nn.Module):
    """Returns a tensor nested twelve containers deep."""

    def __init__(self, depth: int = 12) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.depth = depth

    def forward(self, x: torch.Tensor) -> Any:
        out: Any = self.lin(x)
        for i in range(self.depth):
            out = {"level": out} if i % 2 else (out,)
        return out


class EvalDropout(nn.Module):
    """An eval-mode dropout and an identity compute nothing; they still ran."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.1)
        self.ident = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ident(self.drop(self.lin(x)))


class MomentumNoGrad(nn.Module):
    """A key layer that follows the query layer in place under ``no_grad``; fx does not record the
    ``no_grad``, and shape propagation of its graph wrote the real weights."""

    def __init__(self, frozen: bool) -> None:
        super().__init__()
        self.q = nn.Linear(4, 4)
        self.k = nn.Linear(4, 4)
        for p in self.k.parameters():
            p.requires_grad_(not frozen)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.k.weight.mul_(0.9).add_(0.1 * self.q.weight)
        return self.k(self.q(x))


class MomentumLoop(nn.Module):
    """MoCo's momentum update as its code writes it: a loop over both encoders' ``parameters()``
    under ``no_grad``. fx hands that loop real parameters, not proxies: the writes ran for real
    while fx traced, and its graph had none of them."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(4, 4)
        self.k = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            for pq, pk in zip(self.q.parameters(), self.k.parameters(), strict=True):
                pk.mul_(0.9).add_(pq, alpha=0.1)
        return self.k(self.q(x))


class Nested(nn.Module):
    """A chain of modules ``depth`` levels deep, each calling the next."""

    def __init__(self, depth: int) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.inner = Nested(depth - 1) if depth > 1 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.lin(x)
        return self.inner(x) if self.inner is not None else x


def deep_nested(depth: int, width: int = 4) -> nn.Module:
    """:class:`Nested` built without recursion (a recursive ``__init__`` runs out of stack first)."""
    root: Nested | None = None
    for _ in range(depth):
        m = Nested.__new__(Nested)
        nn.Module.__init__(m)
        m.lin = nn.Linear(width, width)
        m.inner = root
        root = m
    assert root is not None
    return root


def _seeded(make: Callable[[], Built]) -> Callable[[], Built]:
    def build() -> Built:
        torch.manual_seed(0)
        return make()

    return build


def _with_grads() -> Built:
    model = BackwardInForward().train()
    (model.lin(torch.randn(3, 4)) ** 2).sum().backward()  # the user's own gradients, kept
    return model, (torch.randn(3, 4),), {}


#: name -> builder of (model, args, kwargs)
SCENARIOS: dict[str, Callable[[], Built]] = {
    "batchnorm_no_momentum": _seeded(lambda: (BatchNormNoMomentum().train(), (torch.randn(6, 4),), {})),
    "step_counter": _seeded(lambda: (StepCounter().eval(), (torch.randn(3, 4),), {})),
    "python_cache": _seeded(lambda: (PythonCache().eval(), (torch.randn(3, 4),), {})),
    "rebind_buffer": _seeded(lambda: (RebindBuffer().eval(), (torch.randn(3, 4),), {})),
    "tensor_constant": _seeded(lambda: (TensorConstant().eval(), (torch.randn(3, 4),), {})),
    "backward_in_forward": _seeded(lambda: (BackwardInForward().train(), (torch.randn(3, 4),), {})),
    "backward_into_grads": _seeded(_with_grads),
    "momentum_update": _seeded(lambda: (MomentumUpdate().eval(), (torch.randn(3, 4),), {})),
    "momentum_no_grad": _seeded(lambda: (MomentumNoGrad(frozen=False).eval(), (torch.randn(3, 4),), {})),
    "momentum_no_grad_frozen": _seeded(lambda: (MomentumNoGrad(frozen=True).eval(), (torch.randn(3, 4),), {})),
    "momentum_loop": _seeded(lambda: (MomentumLoop().eval(), (torch.randn(3, 4),), {})),
    "input_in_place": _seeded(lambda: (
        InputInPlace().eval(), (torch.randn(3, 4), {"bias": torch.ones(4)}), {})),
    "rebind_to_own_view": _seeded(lambda: (RebindToOwnView().eval(), (torch.randn(3, 4),), {})),
    "rebind_modules": _seeded(lambda: (RebindModules().eval(), (torch.randn(3, 4),), {})),
    "chatty": _seeded(lambda: (Chatty().eval(), (torch.randn(3, 4),), {})),
    "train_dropout": _seeded(lambda: (TrainDropout().train(), (torch.randn(3, 4),), {})),
    "worker_thread": _seeded(lambda: (WorkerThread().eval(), (torch.randn(3, 4),), {})),
    "deep_output": _seeded(lambda: (DeepOutput().eval(), (torch.randn(3, 4),), {})),
    "eval_dropout": _seeded(lambda: (EvalDropout().eval(), (torch.randn(3, 4),), {})),
    "nested_12": _seeded(lambda: (deep_nested(12).eval(), (torch.randn(3, 4),), {})),
}
