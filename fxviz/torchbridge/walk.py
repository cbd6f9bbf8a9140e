"""Walking a model's modules: once per capture, in ``named_modules()`` order, without recursion. The
snapshot, the checks and the tracer all read it (:mod:`fxviz.torchbridge.guard` re-exports it)."""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from torch import nn

if TYPE_CHECKING:
    from fxviz.ir import NodeKind

_second = operator.itemgetter(1)


def named_modules(model: nn.Module, *, remove_duplicate: bool = True) -> list[tuple[str, nn.Module]]:
    """``model.named_modules()`` as a list, in the same order, without recursion: torch's is a
    chain of nested generators, so each module of a chain ``d`` levels deep passes through ``d``
    of them (the square of the depth: 3,200 modules nested 1,600 deep took 3 s per walk). Within
    :func:`walks_shared`, one walk serves the snapshot, the checks and the tracer, and each of its
    two lists is made once: the same list is returned to every caller (read it, never change it)."""
    cached = _WALKS.get(id(model))
    if cached is None or cached[0] is not model:
        cached = [model, _walk(model), None, None]
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


#: :func:`state_of`'s answer: tensor id -> (tensor, kind, name), each entry's module path, and tied
State = tuple["dict[int, tuple[Any, NodeKind, str]]", list[str], bool]


def name_tensors(modules: Iterable[tuple[str, nn.Module]]) -> State:
    """:func:`state_of`'s walk, over ``modules`` (``(path, module)`` pairs) as given."""
    names: dict[int, tuple[Any, NodeKind, str]] = {}
    paths: list[str] = []
    tied = False
    for path, m in modules:
        prefix = f"{path}." if path else ""
        kinds: tuple[tuple[NodeKind, dict[str, Any]], ...] = (("parameter", m._parameters), ("buffer", m._buffers))
        for kind, members in kinds:
            if members:
                for name, t in members.items():
                    if t is not None:
                        if id(t) not in names:
                            names[id(t)] = (t, kind, prefix + name)
                            paths.append(path)
                        else:
                            tied = True
    return names, paths, tied


def state_of(model: nn.Module) -> State:
    """Every parameter and buffer of ``model`` once, in :func:`named_modules` order (each module's
    parameters, then its buffers): by id, the tensor, its kind (``"parameter"``, ``"buffer"``) and
    its first name, as ``named_parameters()`` gives it; the path of the module that owns that name,
    entry for entry; and whether a tensor was met under a second name (a tied weight). Within
    :func:`walks_shared`, made once and shared by the tracer and the state a capture adds (the
    same objects: read them, never change them)."""
    cached = _WALKS.get(id(model))
    if cached is not None and cached[0] is model and cached[3] is not None:
        return cached[3]  # type: ignore[no-any-return]
    state = name_tensors(named_modules(model))
    cached = _WALKS.get(id(model))
    if cached is not None and cached[0] is model:  # sharing
        cached[3] = state
    return state


def is_walk_of(named: list[tuple[str, nn.Module]], model: nn.Module) -> bool:
    """Whether ``named`` is the shared ``named_modules(model, remove_duplicate=False)`` list itself."""
    cached = _WALKS.get(id(model))
    return cached is not None and cached[0] is model and named is cached[1]


def modules_of(model: nn.Module) -> list[nn.Module]:
    """Every module once, in ``model.modules()`` order."""
    return list(map(_second, named_modules(model)))


#: model id -> [the model, its walk, the walk without repeated modules, its state (:func:`state_of`);
#: the last two once asked for]
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


__all__ = ["State", "is_walk_of", "modules_of", "named_modules", "named_state", "state_of", "walks_shared"]
