"""Tiny models for the compiled-autograd tests (``fxviz compile --backward --compiled-autograd``,
tests/test_compile_autograd.py): an MLP, the same with a backward hook that breaks Dynamo in the
backward, and one with a custom ``autograd.Function`` whose backward prints."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def _hook(grad: torch.Tensor) -> None:
    print("fc2.weight grad", grad.sum().item())  # the backward's break: print of a tensor's value


#: The line of the hook's body (the break's user line).
HOOK_LINE = _hook.__code__.co_firstlineno + 1


class MLP(nn.Module):
    def __init__(self, hook: bool | Any = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)
        if hook:
            self.fc2.weight.register_hook(_hook if hook is True else hook)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        print("square backward")  # breaks Dynamo in the backward (and where the forward traces it)
        return 2 * x * grad


class SquareMLP(MLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(Square.apply(torch.relu(self.fc1(x))))


def mlp() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return MLP(), (torch.randn(3, 8),)


def hooked() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return MLP(hook=True), (torch.randn(3, 8),)


def printed() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The hook is library code itself (the builtin ``print``): no user frame in the break's stack."""
    torch.manual_seed(0)
    return MLP(hook=print), (torch.randn(3, 8),)


def square() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return SquareMLP(), (torch.randn(3, 8),)
