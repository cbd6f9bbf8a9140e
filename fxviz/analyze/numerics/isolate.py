"""Each kernel on eager inputs (``--per-kernel``): a kernel's own error, apart from what it inherits.

The watched compiled call (:mod:`~fxviz.analyze.numerics.kernels`) compares each kernel's output with
eager, but the kernel ran on the compiled run's own inputs: every kernel after a wrong one is beyond
tolerance too. So each kernel also runs a second time, on copies of its arguments in which every
buffer it reads holds eager's value of the post-grad node the buffer holds; its output there
against eager is the kernel's own error.

:class:`Shadows` follows the storage of one compiled call as the kernels write it. Each write is
remembered with its place in its storage (byte span, size, stride, offset) and eager's value of what
it holds (``None``: eager has no such value, a partial result inside a fusion, a random draw). A
tensor a kernel reads is then rebuilt on a copy of its storage with every remembered write that
overlaps it replaced by eager's value, so a ``reinterpret_tensor`` view, a reused buffer and an
``in_out_ptr`` read the same bytes as in the compiled call, only with eager's numbers. A storage no
watched kernel wrote is one of the call's inputs (the eager reference runs on the same inputs:
nothing to replace) or, where it is not, a buffer fxviz cannot vouch for: the kernel's own error is
then not measured, and the reason says which buffer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch import nn

from fxviz.analyze.numerics.kernelcode import Written

#: Kernels that are not run a second time: collectives (one rank alone would wait forever) and waits.
_NO_RERUN = ("c10d", "wait_tensor", "_wait")


@dataclass(slots=True)
class _Write:
    storage: Any  # holds the storage: its address is not handed to another buffer while the call runs
    dtype: torch.dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    span: tuple[int, int]  # bytes of the storage it covers
    value: torch.Tensor | None  # eager's value; None: eager has none
    why: str  # why not, with the buffer's name
    derived: torch.Tensor | None = None  # without eager's value: what the kernel wrote there when run on eager's inputs
    by: str = ""  # that kernel


def _key(t: torch.Tensor) -> tuple[str, int]:
    return str(t.device), t.untyped_storage().data_ptr()


def _opaque(t: torch.Tensor) -> bool:
    """A tensor with no storage to copy (an MKL-DNN packed weight of a frozen graph): a constant."""
    try:
        t.untyped_storage()
    except (NotImplementedError, RuntimeError):
        return True
    return False


def _span(t: torch.Tensor) -> tuple[int, int]:
    if t.numel() == 0:
        return 0, 0
    size, offset = t.element_size(), int(t.storage_offset())
    last = sum((int(n) - 1) * abs(int(s)) for n, s in zip(t.shape, t.stride(), strict=True))
    return offset * size, (offset + last + 1) * size


class Shadows:
    """The storage of one compiled call: its inputs' (``inputs``), and each write a watched kernel made."""

    def __init__(self, inputs: list[Any]) -> None:
        self.inputs = {_key(t) for t in inputs if isinstance(t, torch.Tensor) and not _opaque(t)}
        self.writes: dict[tuple[str, int], list[_Write]] = {}

    def wrote(self, t: torch.Tensor, value: torch.Tensor | None, why: str, derived: torch.Tensor | None = None,
              by: str = "") -> None:
        """Kernel ``by`` wrote ``t``; ``value`` is eager's value of what it now holds (``None``: none,
        ``why``); ``derived``: where eager has none, what the kernel wrote there on eager's inputs."""
        span = _span(t)
        if span[0] == span[1] or _opaque(t):
            return
        writes = self.writes.setdefault(_key(t), [])
        writes[:] = [w for w in writes if not (span[0] <= w.span[0] and w.span[1] <= span[1])]  # overwritten
        writes.append(_Write(t.untyped_storage(), t.dtype, tuple(t.shape), tuple(t.stride()), int(t.storage_offset()),
                             span, value, why, derived if value is None else None, by))

    def eager(self, t: torch.Tensor, name: str, *, reads: bool, fresh: bool = False,
              borrowed: list[str] | None = None, copies: dict[tuple[str, int], Any] | None = None,
              ) -> tuple[torch.Tensor | None, str]:
        """A copy of ``t`` (its storage copied, the same view of it) holding eager's values where a
        watched kernel wrote; ``reads``: the kernel reads it (else only its place matters). ``None``
        and why where eager has no value for what it reads and no kernel run on eager's inputs wrote
        one (what one did is used, and named in ``borrowed``). ``fresh``: an ``in_out_ptr`` that nothing
        wrote before is a buffer the kernel itself fills before it reads it (a layer norm's statistics).
        ``copies``: the storages copied for one call so far, shared by the arguments that share one
        (a kernel handed the same buffer to read and to write sees its own write)."""
        span = _span(t)
        key = _key(t)
        over = [w for w in self.writes.get(key, ()) if w.span[0] < span[1] and span[0] < w.span[1]]
        if reads and span[0] < span[1]:
            if not over and key not in self.inputs and not fresh:
                return None, f"{name or 'an input'} was written by no kernel fxviz watched"
            missing = next((w for w in over if w.value is None and w.derived is None), None)
            if missing is not None:
                return None, missing.why
            if borrowed is not None:
                borrowed.extend(f"{name or 'an input'} as {w.by or 'its kernel'} wrote it on eager's inputs"
                                for w in over if w.value is None)
        storage = copies.get(key) if copies is not None else None
        if storage is None:
            storage = t.untyped_storage().clone()
            for w in self.writes.get(key, ()):
                value = w.value if w.value is not None else w.derived
                if value is not None:
                    place = torch.empty(0, dtype=w.dtype, device=t.device).set_(storage, w.offset, w.size, w.stride)
                    place.copy_(value.reshape(w.size))
            if copies is not None:
                copies[key] = storage
        return torch.empty(0, dtype=t.dtype, device=t.device).set_(storage, t.storage_offset(), t.shape, t.stride()), ""

    def untouched(self, t: torch.Tensor) -> bool:
        """``t`` is an input of the call that no watched kernel wrote: eager's value already."""
        key = _key(t)
        span = _span(t)
        return key in self.inputs and not any(
            w.span[0] < span[1] and span[0] < w.span[1] for w in self.writes.get(key, ()))


@dataclass
class Isolated:
    """A kernel call's arguments with eager's values in what it reads (``args``, ``kwargs``), or
    ``why`` it cannot have them; ``borrowed``: the buffers it reads that eager has no value for,
    given what the kernel that wrote them wrote on eager's inputs."""

    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] | None = None
    why: str = ""
    borrowed: list[str] = field(default_factory=list)


def placed(isolated: Isolated, result: Any, place: tuple[str, int]) -> Any:
    """What the second run wrote at ``place``: positional argument ``("arg", i)``, the ``out=``
    argument ``("out", 0)``, item ``i`` of its result ``("item", i)`` or its result ``("result", 0)``."""
    kind, i = place
    if kind == "arg":
        return isolated.args[i] if i < len(isolated.args) else None
    if kind == "out":
        return (isolated.kwargs or {}).get("out")
    if kind == "item":
        return result[i] if isinstance(result, (tuple, list)) and i < len(result) else None
    return result


def isolate(shadows: Shadows, name: str, kind: str, names: list[str], args: tuple[Any, ...],
            kwargs: dict[str, Any], written: Written | None, draws: bool) -> Isolated:
    """The arguments of one kernel call (``names``: the buffers the call line passes, by position)
    rebuilt on eager's values, before the kernel runs. A generated kernel's written arguments are
    copies (an ``in_out_ptr`` with eager's value), its other inputs eager's; an extern kernel's
    ``out=`` a copy; a fallback op (``torch.ops...``) gets copies of everything (it may write an input),
    as does a generated kernel whose written arguments are not known."""
    if any(s in name for s in _NO_RERUN):
        return Isolated(why="a collective is not run twice")
    if draws:
        return Isolated(why="it draws random numbers: run again it draws others")
    # what it writes is not known (a fallback op may write an input; a generated kernel whose written
    # arguments could not be read): every tensor is a copy, so the second run writes none of the call's
    fallback = written is None if kind in ("cpp", "triton") else not name.startswith("extern_kernels.")
    out = Isolated(kwargs={})
    positions = set(written.positions) if written is not None else set()
    inout = set(written.inout) if written is not None else set()
    copies: dict[tuple[str, int], Any] = {}
    targets = [a for i, a in enumerate(args) if i in positions] + [kwargs.get("out")]
    mutated = {_key(t) for t in targets if isinstance(t, torch.Tensor) and not _opaque(t)}

    def one(value: Any, label: str, *, writes: bool, reads: bool) -> Any:
        if not isinstance(value, torch.Tensor) or out.why or _opaque(value):
            return value
        if not writes and not fallback and _key(value) not in mutated and shadows.untouched(value):
            return value  # read only, and eager's value already
        # a buffer this kernel writes that nothing wrote before: it fills it before it reads it (an
        # in_out_ptr; a cat written through aliases and read whole)
        fresh = writes or _key(value) in mutated
        copy, why = shadows.eager(value, label, reads=reads, fresh=fresh, borrowed=out.borrowed, copies=copies)
        if copy is None:
            out.why = why
        return copy

    out.args = tuple(one(a, names[i] if i < len(names) else "", writes=i in positions,
                         reads=i not in positions or i in inout) for i, a in enumerate(args))
    out.kwargs = {k: one(v, k, writes=k == "out", reads=k != "out") for k, v in kwargs.items()}
    return out


class _Keep(torch.fx.Interpreter):
    def __init__(self, gm: torch.fx.GraphModule, keep: set[str]) -> None:
        super().__init__(gm, garbage_collect_values=True)
        self.keep = keep
        self.kept: dict[str, Any] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        value = super().run_node(n)
        if n.name in self.keep and isinstance(value, torch.Tensor):
            self.kept[n.name] = value.detach().clone()
        return value


def eager_values(gm: torch.fx.GraphModule, inputs: list[Any], keep: set[str]) -> dict[str, Any]:
    """The Dynamo graph run eagerly on ``inputs`` (all but parameters copied first); copies of the
    values of the nodes in ``keep`` (those a buffer may stand for)."""
    copies = [v.clone() if isinstance(v, torch.Tensor) and not isinstance(v, nn.Parameter) else v for v in inputs]
    interp = _Keep(gm, keep)
    with torch.no_grad():
        interp.run(*copies)
    return interp.kept


__all__ = ["Isolated", "Shadows", "eager_values", "isolate", "placed"]
