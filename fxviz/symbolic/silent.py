"""Module calls that run no op (an ``Identity``, a wrapper that returns its input) leave nothing in a
symbolic graph: no node carries them in its module stack. They are still calls of the forward, and
every method shows them as nodes of kind ``call`` (as the eager tracer does): the calls that ran
come from the tracer (fx) or from module hooks while export runs the model's Python (non-strict
export) or while the model runs once on fake tensors (strict export, whose Dynamo does not run
hooks' Python); the graph's own stacks tell which of them recorded nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from itertools import chain
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as nn_module

from fxviz.ir import ModuleCall, Node
from fxviz.torchbridge.checks import forked_rng
from fxviz.torchbridge.guard import named_modules
from fxviz.torchbridge.normalize import FlatInputs

Stack = tuple[ModuleCall, ...]


@contextlib.contextmanager
def logged_calls(model: nn.Module) -> Iterator[list[Stack]]:
    """Every call of a submodule of ``model`` while the block runs, as its stack (path and call
    index per level, outermost first), in the order the calls started. A new call of ``model``
    itself starts the list afresh (a tracer that runs the forward twice)."""
    paths = {id(m): p for p, m in named_modules(model)}
    calls: list[Stack] = []
    counts: dict[str, int] = {}
    frames: list[tuple[int, Stack]] = []
    current: list[Stack] = [()]

    def pre(mod: nn.Module, _args: Any) -> None:
        if torch.compiler.is_dynamo_compiling():  # Dynamo traces it (a cond's branches): no side effect
            return
        path = paths.get(id(mod))
        if path is None:
            return
        if path == "":
            calls.clear()
            counts.clear()
            frames.clear()
            current[0] = ()
            return
        n = counts.get(path, 0)
        counts[path] = n + 1
        frames.append((id(mod), current[0]))
        current[0] = (*current[0], (path, n))
        calls.append(current[0])

    def post(mod: nn.Module, _args: Any, _out: Any) -> None:
        if torch.compiler.is_dynamo_compiling() or paths.get(id(mod)) in (None, ""):
            return
        while frames:  # through frames a call that raised (and was caught) left behind
            key, outer = frames.pop()
            if key == id(mod):
                current[0] = outer
                return

    hooks = [nn_module.register_module_forward_pre_hook(pre),
             nn_module.register_module_forward_hook(post, always_call=True)]
    try:
        yield calls
    finally:
        for h in hooks:
            h.remove()


def uncovered(nodes: Sequence[Node], model: nn.Module) -> bool:
    """Does ``model`` hold a module that no node's stack names (unused, or called without ops)?"""
    seen: set[str] = {""}
    for s in {n.stack for n in nodes}:
        seen.update(p for p, _ in s)
    return any(p not in seen for p, _ in named_modules(model))


def fake_run_calls(model: nn.Module, flat: FlatInputs) -> list[Stack] | None:
    """The module calls of one forward on fake tensors (the model's parameters and buffers swapped
    for fake copies: nothing real is written), or ``None`` when it does not run so."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.nn.utils.stateless import _reparametrize_module

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    try:
        state: dict[str, torch.Tensor] = {k: mode.from_tensor(t) for k, t in chain(model.named_parameters(remove_duplicate=False),
                                                          model.named_buffers(remove_duplicate=False))}
        args, kwargs = flat.rebuild(tuple(mode.from_tensor(t) for t in flat.tensors))
        with (_reparametrize_module(model, state), forked_rng(flat.tensors), torch.no_grad(), mode,
              logged_calls(model) as calls):
            model(*args, **kwargs)
    except Exception:  # a forward fake tensors cannot run (a decision on data): the calls stay unknown
        return None
    return list(calls)


def with_silent_calls(nodes: list[Node], called: Sequence[Stack], modules: Mapping[str, nn.Module]) -> list[Node]:
    """``nodes`` with a ``call`` node for each call of ``called`` that no node's stack holds,
    placed before the first op of a call that started after it (and before the outputs)."""
    covered: set[Stack] = set()
    ran: set[str] = set()  # modules some node names: a call of theirs is never taken for silent
    for s in {n.stack for n in nodes}:
        while s and s not in covered:  # each level once: every path of s ends one of its prefixes
            covered.add(s)
            ran.add(s[-1][0])
            s = s[:-1]
    order = {s: i for i, s in enumerate(called)}
    candidates = [s for s in called if s not in covered and s[-1][0] not in ran]
    inner = {s[:-1] for s in candidates}  # a call around a silent call needs no node of its own
    silent = [(order[s], s) for s in candidates if s not in inner]
    if not silent:
        return nodes
    names = {n.name for n in nodes}

    def call_node(stack: Stack) -> Node:
        base = name = stack[-1][0].rpartition(".")[2] or "call"
        k = 0
        while name in names:
            k += 1
            name = f"{base}_{k}"
        names.add(name)
        mod = modules.get(stack[-1][0])
        return Node(name, "call", target=type(mod).__name__ if mod is not None else "", stack=stack)

    out: list[Node] = []
    todo = iter(silent)
    nxt = next(todo, None)
    for n in nodes:
        at = order.get(n.stack) if n.kind in ("op", "call") else (len(called) if n.kind == "output" else None)
        while nxt is not None and at is not None and nxt[0] < at:
            out.append(call_node(nxt[1]))
            nxt = next(todo, None)
        out.append(n)
    while nxt is not None:
        out.append(call_node(nxt[1]))
        nxt = next(todo, None)
    return out


def opaque_note(node: Node, why: str, method: str) -> str:
    """What to say about a module ``method`` kept as one op, its internals unseen."""
    return (f"{method} kept {node.module} ({node.target}) as one op: its submodules' ops are not in the graph "
            f"(it could not be traced through: {why})")


__all__ = ["fake_run_calls", "logged_calls", "opaque_note", "uncovered", "with_silent_calls"]
