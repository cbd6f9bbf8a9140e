"""Recomputation in the eager path's backward: the ops ``torch.utils.checkpoint`` runs again.

C++ backward kernels never pass through ``__torch_function__``; a checkpoint's recomputed forward
is Python code and does. So while the real backward runs (:func:`~fxviz.fallback.backward.add_backward`),
:class:`Recompute` sees each torch-level call: one made while a custom ``autograd.Function``'s
Python backward runs (its grad_fn's pre/post hook window) is that backward's own code and is left
out; every other one is a recomputation. Each is matched to the forward op it repeats: the same
innermost module call (global module hooks say which module runs), the same target, the same
checkpoint call (the one whose function runs again: :class:`~fxviz.torchbridge.checkpoint.Checkpoints`,
or a call nested in it, whose function an outer call's recomputation runs as a forward), the next one
this recomputation has not matched yet. It becomes a node of phase ``recompute`` in that op's module,
``attrs["recomputes"]`` naming the forward op, reading the recomputed values of the forward op's
inputs where those were recomputed too. An inner checkpoint's ops run again twice, as in torch's
step: in the outer region's recomputation and in their own (``<op> (recompute 2)``, which its
backward ops read).

The step runs with checkpoint's early stop as the user's step has it (on by default: torch ends a
region's recomputation inside the pack of the last tensor its forward saved, ``_StopRecomputationError``;
``set_checkpoint_early_stop(False)`` or ``checkpoint(..., early_stop=False)``: the whole region), so the
recompute nodes are the ops torch's own backward runs again, no more. The op in whose save it stops
is one too, ``attrs["stopped"]``, its ``aten`` what of it ran before the stop (autograd packs an op's
inputs before its kernel runs: a linear stopped at its addmm's input ran only ``aten.t``); its result
is dropped.

What checkpointing saved is not read from the recomputation, which under early stop never runs the
rest of a region: it is read in the forward, where every op of the region runs and hands checkpoint
each tensor it would keep (checkpoint's pack hook stores a placeholder instead). The eager path's
watch wraps that hook (:meth:`~fxviz.fallback.backward.Watch.inside`), and :func:`would_save` puts on
each forward op of a non-reentrant region ``attrs["would_save"]``: the bytes of what it would keep for
the backward without checkpointing (each storage once, none that the step saves anyway or that a
selective policy caches, no parameter, buffer or input). It is the forward op's, not a recompute
node's, because it is true of every op of the region, rerun or not: the ``checkpoint_saved``
overlay (:mod:`fxviz.passes.training`) says per module what checkpointing saved, whatever the
early stop skipped, and no node claims an op ran that did not.

``attrs["aten"]`` lists the ATen ops that really ran again: a dispatch mode under the whole
backward sees what runs below a selective checkpoint's caching mode, one around each call what was
asked for; the difference, ``attrs["policy_saved"]``, is what the policy kept (a call of which
nothing ran is no recompute node). What those kept ops returned in the forward is the policy's
cache, memory the step holds as it holds saved tensors, whether or not the recomputation gets to
them: the watch sees the cache fill in the forward (each entry by the forward op that made it), and
:func:`~fxviz.fallback.backward.add_backward` adds them to ``graph.saved``, counted before
``would_save``, which leaves them out.
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import torch
import torch.utils.checkpoint
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from fxviz.fallback.classify import Action, classify
from fxviz.fallback.tensors import tensor_meta
from fxviz.ir import Graph, Node, Ref, Saved
from fxviz.torchbridge.checkpoint import Checkpoints

_plain = torch._C.DisableTorchFunction
_Stop = torch.utils.checkpoint._StopRecomputationError  # raised where checkpoint's early stop ends a recomputation
_STOPPED = object()  # the result of the call that raised it
_CUSTOM = torch.autograd.function.BackwardCFunction


class _Aten(TorchDispatchMode):
    """The ATen ops that reach it, by name. Under the whole backward it is below a selective
    checkpoint's caching mode (entered later, by the recomputation) and sees the ops that really
    run; around one recomputed call it is above it and sees every op asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        self.ops.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


class Recompute(TorchFunctionMode):
    """Records the torch-level calls of the backward that repeat forward ops (module docstring)."""

    def __init__(self, graph: Graph, model: nn.Module, running: list[tuple[Any, Node]],
                 checkpoints: Checkpoints | None = None) -> None:
        super().__init__()
        self.graph, self.running = graph, running
        self.checkpoints = checkpoints or Checkpoints()
        self.paths = {id(m): p for p, m in model.named_modules(remove_duplicate=False)}
        self.modules: list[str] = []
        self.todo: dict[tuple[int | None, str, str], list[Node]] = {}  # (checkpoint call, module, target) -> ops
        for n in graph.nodes:
            if n.kind == "op" and n.phase == "forward":
                self.todo.setdefault((n.attrs.get("checkpoint"), n.module, n.target), []).append(n)
        self.cursor: dict[tuple[int | None, int | None, str, str], int] = {}  # (run, call, module, target) -> next op
        self.again: Counter[str] = Counter()  # forward op -> times repeated
        self.value_of: dict[int, tuple[Ref, Ref]] = {}  # id(recomputed tensor) -> (forward value, recomputed)
        self.keep: list[torch.Tensor] = []  # recomputed tensors stay alive: their ids stay theirs
        self.nodes: list[tuple[Node, Node]] = []  # (recompute node, backward node running it)
        self.made: dict[Any, Ref] = {}  # a recomputed value's tensor (storage, offset, shape, stride), its storage -> it
        self.reads: list[tuple[Node, Ref]] = []  # (backward node, recomputed value it unpacked), as they ran
        self.handles: list[Any] = []
        self.ran = _Aten()

    def __enter__(self) -> Recompute:
        def pre(m: nn.Module, _a: Any) -> None:
            self.modules.append(self.paths.get(id(m), ""))

        def post(_m: nn.Module, _a: Any, _o: Any) -> None:
            if self.modules:
                self.modules.pop()

        self.handles = [nn.modules.module.register_module_forward_pre_hook(pre),
                        nn.modules.module.register_module_forward_hook(post)]
        self.ran.__enter__()
        return super().__enter__()  # type: ignore[no-any-return]

    def __exit__(self, *exc: Any) -> None:
        for h in self.handles:
            h.remove()
        super().__exit__(*exc)
        self.ran.__exit__(*exc)

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        if not self.running:  # outside any backward node
            return func(*args, **(kwargs or {}))
        first = len(self.ran.ops)
        try:
            with _Aten() as asked:
                out = func(*args, **(kwargs or {}))
        except _Stop:  # its save gave checkpoint the last tensor it needed: it ran, its result is dropped
            with _plain():
                self._see(func, args, kwargs, _STOPPED, asked, self.ran.ops[first:])
            raise
        with _plain():
            self._see(func, args, kwargs, out, asked, self.ran.ops[first:])
        return out

    def _see(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any, asked: _Aten,
             ran: list[str]) -> None:
        if not ran or not self.running or isinstance(self.running[-1][0], _CUSTOM):
            return  # outside any backward node, or a custom Function's own backward code
        kind = classify(func, "function")
        if kind.action is Action.SKIP:
            return
        fwd = self._forward_op(self.modules[-1] if self.modules else "", kind.target)
        if fwd is not None:
            ran = [op for op in ran if op != "aten.detach"]  # the checkpoint's own, as it saves
            cached = Counter(op for op in asked.ops if op != "aten.detach") - Counter(ran)  # a selective checkpoint policy kept these
            node = self._add(fwd, args, kwargs or {}, out)
            node.attrs["aten"] = ran
            if cached:
                node.attrs["policy_saved"] = sorted(cached.elements())

    def _forward_op(self, module: str, target: str) -> Node | None:
        """The forward op a call of ``target`` in ``module`` repeats: of the call recomputed now, else of a
        call nested in it (its function runs as a forward again), the next one this recomputation has
        not repeated yet."""
        call, run = self.checkpoints.current(), self.checkpoints.run()
        for c in itertools.chain((call,), self.checkpoints.nested(call) if call is not None else ()):
            ops = self.todo.get((c, module, target))
            at = self.cursor.get((run, c, module, target), 0)
            if ops and at < len(ops):
                self.cursor[(run, c, module, target)] = at + 1
                return ops[at]
        return None

    def _add(self, fwd: Node, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Node:
        outs = [o for o in (out if isinstance(out, tuple | list) else (out,)) if isinstance(o, torch.Tensor)]
        stopped = {"stopped": True} if out is _STOPPED else {}
        reads = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        again = dict(self.value_of[id(a)] for a in reads if id(a) in self.value_of)  # forward ref -> recomputed
        inputs = tuple(again.get(r, r) for r in fwd.inputs)
        self.again[fwd.name] += 1
        times = self.again[fwd.name]
        node = Node(f"{fwd.name} (recompute{f' {times}' if times > 1 else ''})", "op", target=fwd.target, inputs=inputs, stack=fwd.stack,
                    outputs=tuple(tensor_meta(o) for o in outs) or fwd.outputs,
                    attrs={"recomputes": fwd.name, **stopped,
                           **({"checkpoint": fwd.attrs["checkpoint"]} if "checkpoint" in fwd.attrs else {})},
                    phase="recompute")
        for i, o in enumerate(outs):
            self.value_of[id(o)] = (Ref(fwd.name, i), Ref(node.name, i))
            for key in _keys(o):
                self.made.setdefault(key, Ref(node.name, i))
        self.keep += outs
        self.nodes.append((node, self.running[-1][1]))
        return node

    def unpacked(self, t: torch.Tensor) -> None:
        """A checkpoint's unpack hook returned ``t`` (a recomputed value, detached, or a view of one):
        the backward op running reads the recompute node that made it."""
        with _plain():
            if not self.running or isinstance(self.running[-1][0], _CUSTOM):
                return
            keys = _keys(t)
            ref = self.made.get(keys[0]) or self.made.get(keys[1])
            if ref is not None:
                self.reads.append((self.running[-1][1], ref))


def _keys(t: torch.Tensor) -> tuple[Any, Any]:
    """The tensor as a view (its storage, offset, shape, strides), and its storage."""
    key = storage_key(t)
    try:
        return (key, t.storage_offset(), tuple(t.shape), t.stride()), key
    except Exception:  # no strides (a subclass): the storage alone
        return key, key


def storage_key(t: torch.Tensor) -> tuple[int, str]:
    """The storage's identity (its C++ object: on ``meta`` every data pointer is 0); the storages
    compared are all alive while the step runs (autograd holds what it saved), so none is reused."""
    try:
        return (t.untyped_storage()._cdata, "storage")
    except Exception:  # a tensor without storage (a subclass): counted by identity
        return (id(t), "object")


def would_save(graph: Graph, unsaved: list[tuple[str, torch.Tensor]], counted: set[Any], calls: set[str]) -> None:
    """``attrs["would_save"]`` on each forward op recorded in a non-reentrant checkpoint call (``calls``): the
    bytes of what its region's ops packed in the forward (``unsaved``: (op, tensor)), which checkpoint did
    not keep, less the storages ``counted`` (parameters, buffers, inputs, what the step saves, what a
    selective policy caches); each storage once, for the first op that packed it."""
    nodes = {n.name: n for n in graph.nodes if n.phase == "forward" and n.kind == "op"}
    for name in calls:
        if name in nodes:
            nodes[name].attrs["would_save"] = 0
    for op, t in unsaved:
        key = storage_key(t)
        if op not in nodes or key in counted:
            continue
        counted.add(key)
        n = nodes[op]
        n.attrs["would_save"] = n.attrs.get("would_save", 0) + int(t.untyped_storage().nbytes())


def cache_filled(caches: list[dict[Any, dict[int, Any]]], seen: set[tuple[int, Any, int]]) -> list[torch.Tensor]:
    """The tensors of the entries selective checkpoints' ``caches`` (``storage[op key][index]`` of
    torch's caching mode, each value wrapped) gained since ``seen``, which it updates."""
    out = []
    for cache in caches:
        for key, entries in cache.items():
            for i, entry in entries.items():
                if (id(cache), key, i) not in seen:
                    seen.add((id(cache), key, i))
                    out += [t for leaf in torch.utils._pytree.tree_leaves(entry)
                            if isinstance(t := getattr(leaf, "val", None), torch.Tensor)]
    return out


def policy_saved(graph: Graph, cached: list[tuple[str, torch.Tensor]], state: dict[Any, str],
                 counted: set[Any]) -> list[Saved]:
    """The records of what selective checkpoints' policies cached in the forward (``cached``: (op,
    value)): saved by that op, each storage once (``counted``, which it updates; ``state``: what a
    parameter, buffer or input costs nothing as)."""
    nodes = {n.name: n for n in graph.nodes}
    first = next((n.name for n in graph.nodes if n.kind == "op"), "")
    out = []
    for op, t in cached:
        key, m = storage_key(t), tensor_meta(t)
        shares = state.get(key, "view" if key in counted else "")
        counted.add(key)
        saver = op if op in nodes else first
        out.append(Saved(saver, nodes[saver].module if saver in nodes else "", m.shape, m.dtype,
                         0 if shares else int(t.untyped_storage().nbytes()), saver, shares))
    return out


def place(graph: Graph, rec: Recompute) -> None:
    """Let each backward op read the recomputed values it unpacked (torch's own unpacks: checkpoint's
    unpack hook hands it each one), and insert the recompute nodes before the backward op that ran
    them (the first of the region's backward ops to unpack a saved value) or before a reader listed
    earlier, so that every node reads nodes before it."""
    if not rec.nodes:
        return
    reads: dict[str, list[Ref]] = {}
    for b, ref in rec.reads:
        got = reads.setdefault(b.name, [])
        if ref not in got:
            got.append(ref)
    for b in graph.nodes:
        if b.name in reads:
            b.inputs = (*b.inputs, *(r for r in reads[b.name] if r not in b.inputs))
    at = {n.name: k for k, n in enumerate(graph.nodes)}
    readers: dict[str, int] = {}  # recompute node -> the first place of a node that reads it
    for b, ref in rec.reads:
        readers[ref.node] = min(readers.get(ref.node, len(at)), at[b.name])
    anchors = [min(at[runner.name], readers.get(n.name, len(at))) for n, runner in rec.nodes]
    for k in range(len(anchors) - 2, -1, -1):  # in the order they ran: an earlier one never after a later one
        anchors[k] = min(anchors[k], anchors[k + 1])
    before: dict[int, list[Node]] = {}
    for (n, _), k in zip(rec.nodes, anchors, strict=True):
        before.setdefault(k, []).append(n)
    nodes: list[Node] = []
    for k, n in enumerate(graph.nodes):
        nodes += before.pop(k, [])
        nodes.append(n)
    graph.nodes = nodes  # type: ignore[assignment]


__all__ = ["Recompute", "cache_filled", "place", "policy_saved", "storage_key", "would_save"]
