"""Does a capture hold for the example inputs? What the symbolic methods and the chain in
:mod:`fxviz.api` share to confirm it on real inputs, at the cost of one forward at most.

A symbolic capture runs the model on fake tensors, whose kernels check less than real ones (a
matmul of an ``int64`` input with ``float32`` weights goes through), and export defers a data check
(``torch._check(n == 2)``) to a runtime assertion in its graph. So on real inputs the captured
program is run once (export: the graph itself, which also evaluates its assertions and the
predicate of each ``cond``; fx: the forward), and what it raises is a :class:`RejectedInputs`, never
a graph called a success. Inputs on ``meta`` or fake tensors cannot run: nothing is checked then.

Every run here leaves the model, the inputs and the random number generators as found: inputs
and buffers are copied before a run writes them, and the generators are forked.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from fxviz.ir import Assumption, Graph
from fxviz.torchbridge.normalize import FlatInputs
from fxviz.torchbridge.walk import named_state


class RejectedInputs(Exception):
    """The captured program did not run on the example inputs. ``graph`` is what was captured,
    ``assumption`` the runtime assertion of the graph that failed (``None`` when something else
    raised), ``__cause__`` what was raised. :mod:`fxviz.api` runs the model eagerly to tell a
    model that rejects its inputs (a :class:`~fxviz.errors.ModelError`) from a graph that does
    not hold for them (a failed attempt)."""

    def __init__(self, message: str, graph: Graph | None = None, assumption: Assumption | None = None) -> None:
        super().__init__(message)
        self.graph = graph
        self.assumption = assumption


def real_inputs(tensors: Sequence[Any]) -> bool:
    """Can these inputs run for real: none on ``meta``, none a fake tensor?"""
    from torch._subclasses.fake_tensor import FakeTensor

    return not any(isinstance(t, torch.Tensor) and (t.is_meta or isinstance(t, FakeTensor)) for t in tensors)


@contextlib.contextmanager
def forked_rng(tensors: Sequence[Any]) -> Iterator[None]:
    """Random number generators as found afterwards (a forward in train mode draws dropout masks)."""
    devices = sorted({t.device.index or 0 for t in tensors if isinstance(t, torch.Tensor) and t.is_cuda})
    with torch.random.fork_rng(devices=devices):
        yield


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


def confirm_forward(model: nn.Module, flat: FlatInputs, graph: Graph) -> None:
    """Run ``model`` once on copies of the inputs (``flat`` rebuilt: a cache passed in is a new
    object), under ``no_grad``, its buffers put back and the generators forked; raise
    :class:`RejectedInputs` (carrying ``graph``) when it raises."""
    try:
        with kept(model, flat) as (args, kwargs):
            model(*args, **kwargs)
    except Exception as e:
        raise RejectedInputs(f"the model does not run on these inputs: {first_line(e)}", graph) from e


@contextlib.contextmanager
def kept(model: nn.Module, flat: FlatInputs) -> Iterator[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Inputs for one run that leaves everything as found: copies of the tensors rebuilt into
    new containers, ``no_grad``, generators forked, and whatever the run writes in place of the
    model's parameters, buffers and gradients (a momentum update, a ``backward`` inside the
    forward) copied back afterwards (:class:`_SavedBeforeWrite`: only what is written is copied)."""
    guarded: dict[int, torch.Tensor] = {}
    for _, t in [*named_state(model, "_parameters"), *named_state(model, "_buffers")]:  # one walk, no recursion
        guarded.setdefault(t.untyped_storage().data_ptr(), t)
        if t.grad is not None:
            guarded.setdefault(t.grad.untyped_storage().data_ptr(), t.grad)
    saver = _SavedBeforeWrite(guarded)
    try:
        with torch.no_grad(), forked_rng(flat.tensors), saver:
            yield flat.rebuild(tuple(t.detach().clone() for t in flat.tensors))
    finally:
        with torch.no_grad():
            for owner, saved in saver.saved.values():
                owner.data.copy_(saved)  # through .data: no version bump a user's autograd graph sees


class _SavedBeforeWrite(TorchDispatchMode):
    """Copy-on-write for the model's own tensors: before an op writes in place into the storage of
    a guarded tensor (by its ``alias_info``: ``add_``, ``copy_``, an ``out=``), that tensor is copied
    once, so a run can be undone at the cost of what it writes, not of the whole model. A
    higher-order op (``cond``, ``while_loop``) runs as it is: its bodies are functional."""

    supports_higher_order_operators = True

    def __init__(self, guarded: dict[int, torch.Tensor]) -> None:
        super().__init__()
        self.guarded = guarded
        self.saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        schema = getattr(func, "_schema", None)  # a higher-order op has none
        if self.guarded and schema is not None and schema.is_mutable:
            for k, a in enumerate(schema.arguments):
                if a.alias_info is None or not a.alias_info.is_write:
                    continue
                v = args[k] if k < len(args) else kwargs.get(a.name)
                for t in v if isinstance(v, list | tuple) else (v,):
                    if isinstance(t, torch.Tensor) and t.device.type != "meta":
                        key = t.untyped_storage().data_ptr()
                        owner = self.guarded.get(key)
                        if owner is not None and key not in self.saved:
                            self.saved[key] = (owner, owner.detach().clone())
        return func(*args, **kwargs)


def _dynamo_codes() -> list[Any]:
    """The code objects Dynamo has seen (none when it never loaded)."""
    frames = sys.modules.get("torch._dynamo.convert_frame")
    if frames is None:
        return []
    codes = (w() for w in frames.input_codes.seen + frames.output_codes.seen)
    return [c for c in codes if c is not None]


@contextlib.contextmanager
def forget_failed_compiles() -> Iterator[None]:
    """An attempt that fails leaves no compile state of torch's own code behind: ``torch.cond``
    compiles itself when it runs eagerly, and under the eager tracer's dispatch mode that compile
    fails and leaves state on torch's ``cond`` code (its cached entries look unchanged) that makes
    every later non-strict export of a ``cond`` fail. When Dynamo saw new code during a failed
    attempt, torch's own code objects are reset (they compile again when next run); the user's
    code, and so their compiled models, keep theirs."""
    try:
        yield
    except BaseException:
        # every one of torch's codes, not only those first seen now: code an earlier capture
        # compiled (and :class:`~fxviz.torchbridge.guard.DynamoCodes` therefore keeps) can be
        # the one left broken
        for code in _dynamo_codes():
            if code.co_filename.startswith(_TORCH_DIR):
                torch._C._dynamo.eval_frame.reset_code(code)
        raise


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops += 1
        return func(*args, **(kwargs or {}))


def count_ops(model: nn.Module, flat: FlatInputs) -> int:
    """How many ATen ops one forward of ``model`` runs, as :func:`confirm_forward` runs it (inputs
    on ``meta`` run as they are); 0 when it cannot run here. For a graph that holds no op: the
    dispatcher sees the ops of a TorchScript module or a C++ extension, which Python never does."""
    mode = _Count()
    try:
        with kept(model, flat) as (args, kwargs), mode:
            model(*args, **kwargs)
    except Exception:  # it cannot run here (fake inputs, a model that raises): nothing to tell
        return 0
    return mode.ops


__all__ = ["RejectedInputs", "confirm_forward", "count_ops", "first_line", "forget_failed_compiles", "forked_rng", "kept",
           "real_inputs"]
