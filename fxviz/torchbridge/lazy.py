"""Lazy modules (``nn.LazyLinear``, ``nn.LazyConv2d`` …) have no parameters until their first
forward, and every capture method stops on their ``UninitializedParameter``. They are captured as
the user's first call leaves them: that first forward runs on a deep copy of the model (the model
passed in stays uninitialised: a capture leaves the model as it found it), and the copy is captured.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn
from torch.nn.modules.lazy import LazyModuleMixin

from fxviz.errors import InputError, ModelError
from fxviz.torchbridge.checks import first_line, forked_rng
from fxviz.torchbridge.guard import named_modules
from fxviz.torchbridge.normalize import flatten_inputs


def lazy_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The lazy modules of ``model`` whose parameters or buffers are not initialised yet."""
    return [(p, m) for p, m in named_modules(model)
            if isinstance(m, LazyModuleMixin) and m.has_uninitialized_params()]  # type: ignore[no-untyped-call]


def initialised(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[nn.Module, list[str]]:
    """``model`` itself when it holds no uninitialised lazy module; else a deep copy initialised by
    one forward on copies of the inputs (``no_grad``, the random generators forked, every module in
    eval mode for that run so that no running statistic moves), with a note that says so.

    The copy's parameters are those that forward initialised; its buffers and training flags are
    those of the model passed in. Raises :class:`InputError` when the model cannot be copied and
    :class:`ModelError` when that first forward raises, each saying what to do instead."""
    lazy = lazy_modules(model)
    if not lazy:
        return model, []
    names = ", ".join(f"{p or '<root>'} ({type(m).__name__})" for p, m in lazy[:3]) + (" …" if len(lazy) > 3 else "")
    todo = f"run the model once on these inputs (model(*args)) before capturing it, which initialises {names}"
    try:
        twin = copy.deepcopy(model, _fresh_uninitialised(model))
    except Exception as e:
        raise InputError(f"{type(model).__name__} has lazy modules that are not initialised and cannot be "
                         f"copied to initialise them apart ({first_line(e)}): {todo}") from e
    flat = flatten_inputs(twin, args, kwargs)
    modes = [(m, m.training) for _, m in named_modules(twin)]
    buffers = {k: b.detach().clone() for k, b in twin.named_buffers()
               if not isinstance(b, nn.parameter.UninitializedBuffer)}
    try:
        twin.eval()
        with torch.no_grad(), forked_rng(flat.tensors):
            a, k = flat.rebuild(tuple(t.detach().clone() for t in flat.tensors))
            twin(*a, **k)
    except Exception as e:
        raise ModelError(f"{type(model).__name__} has lazy modules that are not initialised, and its first forward, "
                         f"which initialises them, raised {first_line(e)}: fix that forward, or {todo}") from e
    finally:
        for m, training in modes:
            m.training = training
    with torch.no_grad():
        for key, b in twin.named_buffers():
            saved = buffers.get(key)
            if saved is not None and saved.shape == b.shape:
                b.copy_(saved)
    note = (f"lazy modules {names} were initialised by one forward on a copy of the model, which was captured; "
            "the model passed in is left uninitialised")
    return twin, [note]


def _fresh_uninitialised(model: nn.Module) -> dict[int, Any]:
    """A ``deepcopy`` memo that maps each uninitialised parameter and buffer to a new one of the
    same kind (some cannot be deep-copied themselves)."""
    memo: dict[int, Any] = {}
    for _, m in named_modules(model):
        for t in [*m._parameters.values(), *m._buffers.values()]:
            if isinstance(t, nn.parameter.UninitializedParameter | nn.parameter.UninitializedBuffer):
                make: Any = type(t)
                memo[id(t)] = make(requires_grad=t.requires_grad, device=t.device, dtype=t.dtype)
    return memo


__all__ = ["initialised", "lazy_modules"]
