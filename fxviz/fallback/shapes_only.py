"""A forward run for its graph alone: the heaviest kernels skipped. Needs torch.

Where a graph needs no value (only which ops ran, on what shapes), a convolution's or a matrix
product's arithmetic is most of what tracing the forward costs (ResNet-18 at 224x224 on one core:
a 0.11 s eager trace, 0.04 s without its convolutions; GPT-2 small: 0.70 s, 0.24 s without its
matrix products). :class:`ShapesOnly`, a ``TorchDispatchMode`` entered around the forward beneath
the tracer's own modes, answers each op of :data:`HEAVY` with a fresh tensor of zeros of the
size, strides, dtype and device the op's kernel would return, and runs every other op as it is:
the tracer sees the same calls on tensors of the same metadata. A convolution's output is what
torch's meta kernel says (what ``FakeTensor`` runs), on contiguous operands; a matrix product's is ``(n, p)`` (``(b, n, p)``
for ``bmm``), contiguous, in its operands' dtype, checked as the kernel checks them (torch's meta
``addmm`` is a Python decomposition that costs more than a small product itself). Anything else
(a tensor subclass, another layout, operands the kernel would refuse) runs the real kernel.

Only right where nothing the forward does depends on those values. An op that hands a value to
Python (``.item()``, ``if tensor:``, ``torch.equal``: torch tags it ``data_dependent_output``) or
whose output's size depends on values (``nonzero``: ``dynamic_output_shape``) is recorded in
:attr:`ShapesOnly.read` and raised as :class:`ValueRead`, so the run stops there (or, where the
model catches it, goes on): either way the caller throws the run away and traces the forward for
real. Where the caller knows the forward read no value (Dynamo compiled it without a graph break,
which a value read in Python causes), none is met.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

_aten = torch.ops.aten
_TAGS = (torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape)
_PLAIN = (torch.Tensor, torch.nn.Parameter)  # no kernel of their own
_FLOATS = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16})
Size = tuple[int, ...]


def _operands(*ts: Any) -> bool:
    """Plain dense floating tensors of one dtype on one device: operands a matrix product takes."""
    a = ts[0]
    return all(type(t) in _PLAIN and t.layout is torch.strided and t.dtype is a.dtype and t.device == a.device
               for t in ts) and a.dtype in _FLOATS


def _mm(a: Any, b: Any, *_: Any, **__: Any) -> Size | None:
    if _operands(a, b) and a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0]:
        return (a.shape[0], b.shape[1])
    return None


def _addmm(bias: Any, a: Any, b: Any, *_: Any, **__: Any) -> Size | None:
    out = _mm(a, b) if isinstance(bias, torch.Tensor) and _operands(bias, a) else None
    if out is None or bias.dim() > 2 or any(s not in (1, o) for s, o in zip(reversed(bias.shape), reversed(out), strict=False)):
        return None
    return out


def _bmm(a: Any, b: Any, *_: Any, **__: Any) -> Size | None:
    if _operands(a, b) and a.dim() == 3 and b.dim() == 3 and a.shape[0] == b.shape[0] and a.shape[2] == b.shape[1]:
        return (a.shape[0], a.shape[1], b.shape[2])
    return None


#: Ops whose output is a new tensor made by arithmetic that dominates a forward's cost, with the
#: size of their contiguous output (None: run the kernel); ``None`` for the convolution: its output
#: (channels-last or not) is what its meta kernel says.
HEAVY: dict[Any, Callable[..., Size | None] | None] = {
    _aten.convolution.default: None, _aten.mm.default: _mm, _aten.addmm.default: _addmm, _aten.bmm.default: _bmm,
}
_RUN, _SKIP, _READ = 0, 1, 2


class ValueRead(RuntimeError):
    """The forward handed a tensor's values to Python (an op tagged as in :data:`_TAGS`)."""


def _action(func: Any) -> int:
    if func in HEAVY:
        return _SKIP
    return _READ if any(t in _TAGS for t in getattr(func, "tags", ())) else _RUN


class ShapesOnly(TorchDispatchMode):
    """Skip the arithmetic of :data:`HEAVY` ops: their outputs are zeros of the kernel's size and
    strides. ``read`` names the first value-reading op met (then the run is not the model's);
    ``skipped`` counts the kernels not run."""

    def __init__(self) -> None:
        super().__init__()
        self.read: str | None = None
        self.skipped = 0
        self._actions: dict[Any, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        act = self._actions.get(func)
        if act is None:
            act = self._actions[func] = _action(func)
        if act == _RUN:
            return func(*args, **(kwargs or {}))
        if act == _READ:
            if self.read is None:
                self.read = str(func)
            raise ValueRead(f"{func} hands tensor values to Python: the forward is traced for real")
        return self._skip(func, args, kwargs or {})

    def _skip(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        shape = HEAVY[func]
        if shape is not None:
            size = shape(*args, **kwargs)
            if size is None:
                return func(*args, **kwargs)
            self.skipped += 1
            a = args[1] if func is _aten.addmm.default else args[0]
            return torch.zeros(size, dtype=a.dtype, device=a.device)
        flat = [t for t in pytree.arg_tree_leaves(*args, **kwargs) if isinstance(t, torch.Tensor)]
        # contiguous operands only: a channels-last kernel's output layout depends on the device's
        # backend, which a meta tensor does not have
        if not flat or not all(type(t) in _PLAIN and t.layout is torch.strided and not t.is_quantized
                               and t.is_contiguous() for t in flat):
            return func(*args, **kwargs)
        try:
            margs, mkwargs = pytree.tree_map_only(torch.Tensor, _meta, (args, kwargs))
            out = func(*margs, **mkwargs)
        except Exception:  # noqa: BLE001 - arguments the meta kernel refuses: the kernel says why
            return func(*args, **kwargs)
        if not isinstance(out, torch.Tensor) or not out.is_contiguous():
            return func(*args, **kwargs)
        self.skipped += 1
        return torch.zeros(out.size(), dtype=out.dtype, device=flat[0].device)


def _meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device="meta")


__all__ = ["HEAVY", "ShapesOnly", "ValueRead"]
