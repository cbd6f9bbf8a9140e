"""Recomputation in the eager path's backward: the ops ``torch.utils.checkpoint`` runs again.

C++ backward kernels never pass through ``__torch_function__``; a checkpoint's recomputed forward
is Python code and does. So while the real backward runs (:func:`~fxviz.fallback.backward.add_backward`),
:class:`Recompute` sees each torch-level call: one made while a custom ``autograd.Function``'s
Python backward runs (its grad_fn's pre/post hook window) is that backward's own code and is left
out; every other one is a recomputation. Each is matched to the forward op it repeats: the same
innermost module call (global module hooks say which module runs), the same target, the same
checkpoint call (the one whose function runs again: :class:`~fxviz.torchbridge.checkpoint.Checkpoints`),
the next one not yet matched there. It becomes a node of phase ``recompute`` in that op's module,
``attrs["recomputes"]`` naming the forward op, reading the recomputed values of the forward op's
inputs where those were recomputed too. ``attrs["would_save"]`` is what the op would keep for the
backward without checkpointing: the tensors its autograd nodes saved in the recomputation (each
forward value once, none that the step saves anyway, no parameter, buffer or input), so that
the ``checkpoint_saved`` overlay (:mod:`fxviz.passes.training`) says per module what
checkpointing saved. The forward runs with the checkpoint's early stop off, so the whole region is
recomputed and every op's outputs are seen.

``attrs["aten"]`` lists the ATen ops that really ran again: a dispatch mode under the whole
backward sees what runs below a selective checkpoint's caching mode, one around each call what was
asked for; the difference, ``attrs["policy_saved"]``, is what the policy kept (a call of which
nothing ran is no recompute node). What those kept ops return is the policy's cache, memory the step
holds as it holds saved tensors: :attr:`Recompute.policy_saved` lists each (the forward op that made
it, its bytes counted once), and :func:`~fxviz.fallback.backward.add_backward` adds them to
``graph.saved``; they count before the recomputation's own saves, so ``would_save`` leaves them out.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from fxviz.fallback.classify import Action, classify
from fxviz.fallback.tensors import tensor_meta
from fxviz.ir import Graph, Node, Ref
from fxviz.torchbridge.checkpoint import Checkpoints

_plain = torch._C.DisableTorchFunction
_CUSTOM = torch.autograd.function.BackwardCFunction


class _Aten(TorchDispatchMode):
    """The ATen ops that reach it, by name. Under the whole backward it is below a selective
    checkpoint's caching mode (entered later, by the recomputation) and sees the ops that really
    run; around one recomputed call it is above it and sees every op asked for."""

    def __init__(self, outputs: bool = False) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.outputs: list[Any] | None = [] if outputs else None  # what each op returned, if asked

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        self.ops.append(str(func.overloadpacket))
        out = func(*args, **(kwargs or {}))
        if self.outputs is not None:
            self.outputs.append(out)
        return out


class Recompute(TorchFunctionMode):
    """Records the torch-level calls of the backward that repeat forward ops (module docstring)."""

    def __init__(self, graph: Graph, model: nn.Module, running: list[tuple[Any, Node]], forward_fns: set[Any],
                 counted: set[Any], saved_values: set[tuple[str, int]], checkpoints: Checkpoints | None = None) -> None:
        super().__init__()
        self.graph, self.running = graph, running
        self.checkpoints = checkpoints or Checkpoints()
        self.paths = {id(m): p for p, m in model.named_modules(remove_duplicate=False)}
        self.modules: list[str] = []
        self.todo: dict[tuple[int | None, str, str], list[Node]] = {}  # (checkpoint call, module, target) -> ops
        for n in graph.nodes:
            if n.kind == "op" and n.phase == "forward":
                self.todo.setdefault((n.attrs.get("checkpoint"), n.module, n.target), []).append(n)
        self.value_of: dict[int, tuple[Ref, Ref]] = {}  # id(recomputed tensor) -> (forward value, recomputed)
        self.alias: dict[Any, Any] = {}  # storage of a recomputed value -> the forward value it repeats
        self.counted = counted  # storage keys already counted (parameters, buffers, inputs, saved values)
        self.counted |= {("value", *v) for v in saved_values}  # forward values the step saves anyway
        self.forward_fns = forward_fns  # the forward's autograd nodes: not the recomputation's
        self.keep: list[torch.Tensor] = []  # recomputed tensors stay alive: their ids stay theirs
        self.seen_fns: set[Any] = set()
        self.nodes: list[tuple[Node, Node]] = []  # (recompute node, backward node running it)
        self.policy_saved: list[tuple[str, torch.Tensor, int, str]] = []  # (forward op, value, bytes, shares)
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
        with _Aten(outputs=True) as asked:
            out = func(*args, **(kwargs or {}))
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
        todo = self.todo.get((self.checkpoints.current(), self.modules[-1] if self.modules else "", kind.target))
        if todo:
            ran = [op for op in ran if op != "aten.detach"]  # the checkpoint's own, as it saves
            cached = Counter(op for op in asked.ops if op != "aten.detach") - Counter(ran)  # a selective checkpoint policy kept these
            self._policy_saved(todo[0].name, cached, asked)  # before the recomputation's own saves are counted
            node = self._add(todo.pop(0), args, kwargs or {}, out)
            node.attrs["aten"] = ran
            if cached:
                node.attrs["policy_saved"] = sorted(cached.elements())

    def _add(self, fwd: Node, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Node:
        outs = [o for o in (out if isinstance(out, tuple | list) else (out,)) if isinstance(o, torch.Tensor)]
        reads = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        again = dict(self.value_of[id(a)] for a in reads if id(a) in self.value_of)  # forward ref -> recomputed
        inputs = tuple(again.get(r, r) for r in fwd.inputs)
        node = Node(f"{fwd.name} (recompute)", "op", target=fwd.target, inputs=inputs, stack=fwd.stack,
                    outputs=tuple(tensor_meta(o) for o in outs) or fwd.outputs,
                    attrs={"recomputes": fwd.name, "would_save": self._would_save(outs),
                           **({"checkpoint": fwd.attrs["checkpoint"]} if "checkpoint" in fwd.attrs else {})},
                    phase="recompute")
        for i, o in enumerate(outs):
            self.value_of[id(o)] = (Ref(fwd.name, i), Ref(node.name, i))
            self.alias.setdefault(storage_key(o), ("value", fwd.name, i))
        self.keep += outs
        self.nodes.append((node, self.running[-1][1]))
        return node

    def _policy_saved(self, fwd: str, cached: Counter[str], asked: _Aten) -> None:
        """The values a selective policy cached in the forward (what the ops it kept return here):
        saved by forward op ``fwd``, each storage once."""
        left = Counter(cached)
        for op, got in zip(asked.ops, asked.outputs or [], strict=False):
            if left[op] <= 0:
                continue
            left[op] -= 1
            for t in (got if isinstance(got, tuple | list) else (got,)):
                if isinstance(t, torch.Tensor):
                    nbytes = self._count(storage_key(t), t)
                    self.policy_saved.append((fwd, t, nbytes, "" if nbytes else "view"))

    def _would_save(self, outs: list[torch.Tensor]) -> int:
        """Bytes the autograd nodes this call made saved (the recomputation saves them as the
        forward would have): each storage once, none counted already."""
        total, todo = 0, [o.grad_fn for o in outs if o.grad_fn is not None]  # autograd nodes
        while todo:
            f = todo.pop()
            if f is None or f in self.seen_fns or f in self.forward_fns or type(f).__name__ == "AccumulateGrad":
                continue
            self.seen_fns.add(f)
            for attr in dir(f):
                if attr.startswith("_saved_"):
                    try:
                        v = getattr(f, attr)
                    except Exception:
                        continue
                    for t in (v if isinstance(v, tuple | list) else (v,)):
                        if isinstance(t, torch.Tensor):
                            total += self._count(storage_key(t), t)
            todo += [g for g, _ in f.next_functions if g is not None]
        return total

    def _count(self, key: Any, t: torch.Tensor) -> int:
        keys = {key, self.alias.get(key, key)}  # the storage, and the forward value it repeats
        if keys & self.counted:
            return 0
        self.counted |= keys
        return int(t.untyped_storage().nbytes())


def storage_key(t: torch.Tensor) -> tuple[int, str]:
    """The storage's identity (its C++ object: on ``meta`` every data pointer is 0); the storages
    compared are all alive while the step runs (autograd holds what it saved), so none is reused."""
    try:
        return (t.untyped_storage()._cdata, "storage")
    except Exception:  # a tensor without storage (a subclass): counted by identity
        return (id(t), "object")


def place(graph: Graph, rec: Recompute) -> None:
    """Insert the recompute nodes before the backward op that ran them (the first of the region's
    backward ops to unpack a saved value), and let the backward ops of a recomputed forward op read
    its recomputation."""
    if not rec.nodes:
        return
    again = {n.attrs["recomputes"]: n for n, _ in rec.nodes}
    for b in graph.nodes:
        r = again.get(b.attrs.get("forward", "")) if b.phase == "backward" else None
        if r is not None:
            extra = [Ref(r.name, i) for i in range(len(r.outputs))]
            b.inputs = (*b.inputs, *(x for x in extra if x not in b.inputs))
    before: dict[str, list[Node]] = {}
    for n, at in rec.nodes:
        before.setdefault(at.name, []).append(n)
    nodes: list[Node] = []
    for n in graph.nodes:
        nodes += before.pop(n.name, [])
        nodes.append(n)
    for rest in before.values():
        nodes += rest
    graph.nodes = nodes  # type: ignore[assignment]


__all__ = ["Recompute", "place", "storage_key"]
