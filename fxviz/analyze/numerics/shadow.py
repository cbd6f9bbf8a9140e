"""Sides that run in lower precision, by *shadow execution*: each op of the eager float32 run is run
a second time on the shadows of its inputs (the float32 tensors cast to bfloat16/float16, or as
they are under autocast), found through a weak identity map, so the shadow dies with its float32
tensor. The two results are compared at once and only the shadow is kept: memory is one forward
plus the shadows alive at the same time. The model is never copied or cast: a parameter is cast
when an op reads it, and the cast dropped after.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils.weak import WeakIdKeyDictionary

from fxviz.analyze.numerics.metrics import compare
from fxviz.analyze.numerics.result import Error
from fxviz.analyze.numerics.run import UNINITIALISED, Watcher, zero_unwritten
from fxviz.ir import Node
from fxviz.ops import DROPOUTS, RANDOM, op_name


def may_write(func: Any, kwargs: dict[str, Any]) -> bool:
    """Whether a torch-function call may write its arguments (then a shadow that *is* its float32
    tensor, an integer index or an autocast input, is copied first, so eager's value is not written
    twice)."""
    name = getattr(func, "__name__", "")
    return (name.endswith("_") and not name.endswith("__")) or name.startswith("__i") or name == "__setitem__" \
        or bool(kwargs.get("inplace")) or "out" in kwargs


class ShadowWatcher(Watcher):
    """Runs each op again in ``dtype`` (``autocast=False``: the model as if cast with
    ``model.to(dtype)``, inputs included) or under ``torch.autocast`` (``autocast=True``) and
    records the :class:`Error` of every tensor it outputs (``errors``: node name -> one per output).
    Random ops are not comparable: the shadow takes eager's value there (cast), so what follows
    compares the same random draw."""

    def __init__(self, dtype: torch.dtype, *, autocast: bool, rtol: float, atol: float) -> None:
        self.dtype, self.autocast, self.rtol, self.atol = dtype, autocast, rtol, atol
        self.shadows: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.errors: dict[str, list[Error]] = {}
        self.random: list[str] = []
        self.raised: list[str] = []  # ops that raised in ``dtype``: not compared, their users start from eager's value

    def shadow(self, t: torch.Tensor) -> torch.Tensor:
        s = self.shadows.get(t)
        if s is None:
            s = t.to(self.dtype) if t.is_floating_point() and not self.autocast else t
            # an input or a buffer: its cast is kept while the tensor lives; a parameter's is made
            # on each use and dropped, so a copy of the weights never exists (GPT-2 reads each once)
            if s is not t and not isinstance(t, torch.nn.Parameter):
                self.shadows[t] = s
        return s

    def before(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        leaves, spec = pytree.tree_flatten((args, kwargs))
        if not any(isinstance(x, torch.Tensor) for x in leaves):
            return (args, kwargs)
        copy = may_write(func, kwargs)
        out = []
        for x in leaves:
            if isinstance(x, torch.Tensor):
                s = self.shadow(x)
                out.append(s.clone() if copy and s is x else s)
            else:
                out.append(x)
        if not self.autocast and not copy:
            out = self._one_dtype(leaves, out)
        return pytree.tree_unflatten(out, spec)

    def _one_dtype(self, leaves: list[Any], shadows: list[Any]) -> list[Any]:
        """Where eager's floating tensors share one dtype but their shadows do not, every shadow in
        ``dtype``: in the model cast with ``model.to(dtype)`` they are all ``dtype``. Shadows part
        because the model reads dtypes from its float32 tensors (``x.to(self.weight.dtype)``,
        ``h.to(input_dtype)`` after a norm computed in float32, ``torch.tensor(s, dtype=q.dtype)``):
        the cast model reads ``dtype`` there. Without this a linear layer after a LLaMA norm raises
        on mixed dtypes (its value not compared, and what follows restarted from eager's) and an
        add keeps the rest of the stream in float32."""
        eager = {x.dtype for x in leaves if isinstance(x, torch.Tensor) and x.is_floating_point()}
        mixed = {s.dtype for s in shadows if isinstance(s, torch.Tensor) and s.is_floating_point()}
        if len(eager) != 1 or len(mixed) < 2 or self.dtype not in mixed:
            return shadows
        return [s.to(self.dtype) if isinstance(s, torch.Tensor) and s.is_floating_point() else s for s in shadows]

    def after(self, node: Node | None, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
              out: Any, state: Any) -> None:
        if node is None:
            return
        eager_out = pytree.tree_leaves(out)
        if is_random(node):
            self.random.append(node.name)
            for o in eager_out:
                if isinstance(o, torch.Tensor):
                    self.shadows[o] = o.to(self.dtype) if o.is_floating_point() and not self.autocast else o
            self.errors[node.name] = [Error(comparable=False, note="random op: the other side takes eager's draw")]
            return
        s_args, s_kwargs = state
        ctx = torch.autocast(device_type=_device(eager_out), dtype=self.dtype) if self.autocast \
            else contextlib.nullcontext()
        try:
            with ctx:
                s_out = func(*s_args, **s_kwargs)
        except Exception as e:  # noqa: BLE001 - an op without a kernel for this dtype is a finding, not a crash
            self.errors[node.name] = [Error(comparable=False, note=f"{type(e).__name__} in {self.dtype}: {e}"[:200])]
            self.raised.append(node.name)
            return
        zero_unwritten(op_name(node.target), s_out)
        if s_out is None and out is not None:  # ``x[i] = v`` wrote x's shadow: that is its value
            s_out = _shadow_of(out, args, kwargs, s_args, s_kwargs)
        shadow_out = pytree.tree_leaves(s_out)
        if len(shadow_out) != len(eager_out):
            self.errors[node.name] = [Error(comparable=False, note="outputs differ in structure")]
            return
        errs = []
        for o, s in zip(eager_out, shadow_out, strict=True):
            if isinstance(o, torch.Tensor) and isinstance(s, torch.Tensor):
                if s is not o:
                    self.shadows[o] = s
                errs.append(compare(o, s, self.rtol, self.atol))
        if is_uninitialised(node):  # the shadow is made (an in-place op fills it), not compared
            errs = [Error(comparable=False, note=UNWRITTEN)]
        if errs:
            self.errors[node.name] = errs


def is_random(node: Node) -> bool:
    """Whether an op's value depends on the random number generator: a sampling op, or dropout
    that is active (training, ``p`` > 0)."""
    name = op_name(node.target)
    if name in RANDOM:
        return True
    if name not in DROPOUTS:
        return False
    a = node.attrs
    return bool(a.get("training", a.get("train", a.get("arg2", True)))) and a.get("p", a.get("arg1", 0.5)) != 0


#: The note of such an op's value.
UNWRITTEN = "uninitialised memory: compared once written, at the in-place op that fills it"


def is_uninitialised(node: Node) -> bool:
    """Whether an op returns memory it does not write (:data:`UNINITIALISED`): its value is never
    compared; a later in-place write's output is."""
    return op_name(node.target) in UNINITIALISED


def _shadow_of(out: Any, args: tuple[Any, ...], kwargs: dict[str, Any], s_args: Any, s_kwargs: Any) -> Any:
    """The shadow arguments at the places of the eager arguments a call wrote (``out``)."""
    eager, shadow = pytree.tree_leaves((args, kwargs)), pytree.tree_leaves((s_args, s_kwargs))
    if len(eager) != len(shadow):
        return None
    where = {id(t): s for t, s in zip(eager, shadow, strict=True) if isinstance(t, torch.Tensor)}
    return pytree.tree_map(lambda t: where.get(id(t)) if isinstance(t, torch.Tensor) else t, out)


def _device(values: list[Any]) -> str:
    return next((v.device.type for v in values if isinstance(v, torch.Tensor)), "cpu")


__all__ = ["UNINITIALISED", "UNWRITTEN", "ShadowWatcher", "is_random", "is_uninitialised", "may_write"]
