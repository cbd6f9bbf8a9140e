"""Walking a model's modules: once per capture, in ``named_modules()`` order, without recursion. The
snapshot, the checks and the tracer all read it (:mod:`fxviz.torchbridge.guard` re-exports it)."""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Iterator
from typing import Any

from torch import nn

_second = operator.itemgetter(1)


def named_modules(model: nn.Module, *, remove_duplicate: bool = True) -> list[tuple[str, nn.Module]]:
    """``model.named_modules()`` as a list, in the same order, without recursion: torch's is a
    chain of nested generators, so each module of a chain ``d`` levels deep passes through ``d``
    of them (the square of the depth: 3,200 modules nested 1,600 deep took 3 s per walk). Within
    :func:`walks_shared`, one walk serves the snapshot, the checks and the tracer, and each of its
    two lists is made once: the same list is returned to every caller (read it, never change it)."""
    cached = _WALKS.get(id(model))
    if cached is None or cached[0] is not model:
        cached = [model, _walk(model), None]
        if _SHARING:
            _WALKS[id(model)] = cached
    if not remove_duplicate:
        return cached[1] if _SHARING else list(cached[1])
    if cached[2] is None:  # kept in the cache entry only while sharing (an entry apart otherwise)
        seen: set[int] = set()
        cached[2] = [(p, m) for p, m in cached[1] if id(m) not in seen and not seen.add(id(m))]  # type: ignore[func-returns-value]
    return cached[2]


def _walk(model: nn.Module) -> list[tuple[str, nn.Module]]:
    out: list[tuple[str, nn.Module]] = []
    todo: list[tuple[str, nn.Module]] = [("", model)]
    while todo:
        path, m = todo.pop()
        out.append((path, m))
        if m._modules:  # (a leaf, half of most models: no list to make)
            prefix = f"{path}." if path else ""
            todo.extend(reversed([(prefix + name, c) for name, c in m._modules.items() if c is not None]))
    return out


def named_state(model: nn.Module, members: str, *, remove_duplicate: bool = True) -> list[tuple[str, Any]]:
    """``model.named_parameters()`` (``members="_parameters"``) or ``model.named_buffers()``
    (``"_buffers"``) as a list, in the same order, over :func:`named_modules`: torch's pass every
    tensor through one nested generator per level of nesting (the square of the depth)."""
    out: list[tuple[str, Any]] = []
    seen: set[int] = set()
    for path, m in named_modules(model, remove_duplicate=remove_duplicate):
        own = getattr(m, members)
        if own:
            prefix = f"{path}." if path else ""
            for k, t in own.items():
                if t is None or id(t) in seen:
                    continue
                if remove_duplicate:
                    seen.add(id(t))
                out.append((prefix + k, t))
    return out


def modules_of(model: nn.Module) -> list[nn.Module]:
    """Every module once, in ``model.modules()`` order."""
    return list(map(_second, named_modules(model)))


#: model id -> [the model, its walk, the walk without repeated modules (once asked for)]
_WALKS: dict[int, list[Any]] = {}
_SHARING = False


@contextlib.contextmanager
def walks_shared() -> Iterator[None]:
    """Walk each model's modules once for the block (a capture: the structure it walks is put back
    after every attempt), instead of once for each part that needs it."""
    global _SHARING
    outer = _SHARING
    _SHARING = True
    try:
        yield
    finally:
        _SHARING = outer
        if not outer:
            _WALKS.clear()


__all__ = ["modules_of", "named_modules", "named_state", "walks_shared"]
