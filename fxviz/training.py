"""The capture methods of ``fxviz.capture(backward=True)``: the joint graph through export
(:mod:`fxviz.symbolic.joint`), then the eager tracer with the real autograd graph
(:mod:`fxviz.fallback.backward`). :func:`fxviz.api.capture` chains them as it chains the forward
methods, with the same attempts, snapshots and isolation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from fxviz.errors import TargetError
from fxviz.fallback.backward import trace_backward
from fxviz.ir import Graph
from fxviz.symbolic.joint import capture_joint
from fxviz.torchbridge.training import Loss, LossError

Capturer = Callable[[nn.Module, tuple[Any, ...], dict[str, Any], Any, bool], Graph]

#: What ``backward=True`` with ``method="auto"`` tries, in order.
TRAINING_CHAIN: tuple[str, ...] = ("export", "eager")

#: Errors of bad input that no other method would get past: raised as they are.
FATAL: tuple[type[BaseException], ...] = (LossError,)


def training_methods(method: str, loss: Loss | None) -> tuple[dict[str, Capturer], tuple[str, ...]]:
    """The capturers of a training step, by method name, and the methods to try for ``method``."""
    capturers: dict[str, Capturer] = {
        "export": lambda m, a, k, _ds, _v: capture_joint(m, a, k, loss=loss),
        "eager": lambda m, a, k, _ds, _v: trace_backward(m, a, k, loss=loss),
    }
    if method == "auto":
        return capturers, TRAINING_CHAIN
    if method not in capturers:
        raise TargetError(f"backward=True captures with method 'auto', 'export' (the joint graph) or 'eager' "
                          f"(the tracer and the autograd graph), not {method!r}")
    return capturers, (method,)


__all__ = ["FATAL", "TRAINING_CHAIN", "training_methods"]
