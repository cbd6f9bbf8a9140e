"""What both training captures share (:mod:`fxviz.symbolic.joint`, :mod:`fxviz.fallback.backward`):
the loss of one step and the checks that make bad input one clear line."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from fxviz.errors import InputError
from fxviz.torchbridge.normalize import flatten_outputs

Loss = Callable[[Any], torch.Tensor]

NOTHING_TO_DIFFERENTIATE = ("the loss does not depend on any parameter or input that requires grad (a detached or "
                            "no_grad output, or an integer loss): nothing to differentiate; give loss=fn a loss "
                            "computed from the model's trainable outputs")


class LossError(InputError):
    """The step has nothing to differentiate: no parameter requires grad, the output holds no
    floating tensor and no loss was given, or the loss is not a scalar. Never worth another
    capture method: :func:`fxviz.api.capture` raises it as it is."""


class BackwardError(Exception):
    """The backward of the step raised (the model's own backward code, a custom ``autograd.Function``):
    the forward graph is kept and the error noted on it."""


def check_trainable(model: nn.Module, inputs: tuple[Any, ...]) -> None:
    """Raise :class:`LossError` when neither a parameter nor an input requires grad."""
    if any(p.requires_grad for p in model.parameters()):
        return
    if any(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs):
        return
    raise LossError(f"no parameter of {type(model).__name__} requires grad (and no input does): there is no "
                    "backward to capture; unfreeze a layer (requires_grad_(True)) or capture without backward")


def step_loss(output: Any, loss: Loss | None) -> torch.Tensor:
    """The scalar the step differentiates: ``loss(output)``, or by default the sum of every floating
    tensor of the output (each summed to a scalar, then added)."""
    if loss is not None:
        value = loss(output)
        if not isinstance(value, torch.Tensor):
            raise LossError(f"loss returned {returned(value)}, not a tensor: return a scalar tensor")
    else:
        leaves = [v for _, v in flatten_outputs(output) if isinstance(v, torch.Tensor)
                  and v.is_floating_point()]
        if not leaves:
            what = type(output).__name__
            raise LossError(f"the model's output ({what}) holds no floating tensor to sum into a loss: pass "
                            "loss=fn(output) -> scalar tensor (fxviz --loss FILE.py:FN)")
        value = leaves[0].sum()
        for v in leaves[1:]:
            value = value + v.sum()
    if value.dim() != 0:
        raise LossError(f"the loss has shape {list(value.shape)}, not a scalar: reduce it (e.g. .mean()) in loss=fn")
    return value


#: what a traced run's ``.item()`` gives (``SymFloat``): named as the user's own run gives it
_PLAIN = {"SymFloat": "float", "SymInt": "int", "SymBool": "bool"}


def returned(value: Any) -> str:
    """The type of what a loss returned, as the user's code makes it (``float``, never export's ``SymFloat``)."""
    name = type(value).__name__
    return _PLAIN.get(name, name)


def unread_outputs(output: Any, value: torch.Tensor) -> list[str]:
    """The paths of the output's tensors that require grad but that the loss ``value`` does not read:
    their autograd nodes are not reached from the loss's (``grad_fn.next_functions``)."""
    leaves = [(p, v) for p, v in flatten_outputs(output) if isinstance(v, torch.Tensor) and v.grad_fn is not None]
    if not leaves or value.grad_fn is None:
        return []
    reached = reachable([value.grad_fn])
    return [p for p, v in leaves if v.grad_fn not in reached]


def reachable(roots: list[Any]) -> set[Any]:
    """Every autograd node reachable from ``roots`` (``None`` among them is skipped) through
    ``next_functions``."""
    seen: set[Any] = set()
    todo = [r for r in roots if r is not None]
    while todo:
        f = todo.pop()
        if f not in seen:
            seen.add(f)
            todo += [g for g, _ in f.next_functions if g is not None]
    return seen


__all__ = ["NOTHING_TO_DIFFERENTIATE", "BackwardError", "Loss", "LossError", "check_trainable", "reachable", "step_loss", "unread_outputs"]
