"""The backward a forward runs itself: a pipeline schedule's step with a ``loss_fn`` runs each
microbatch's backward inside ``step()`` (``torch.autograd.backward`` on the stage's outputs, given
the gradients the next stage sent), and so may any model's forward (``loss.backward()``).

The autograd engine runs that backward in C++: no torch-function mode sees its ops, nor the Python
``backward`` of a custom ``autograd.Function`` (the recording mode is off while the call that
started the backward runs). So a forward capture showed the step's forward ops and nothing of its
backward, where ``capture(backward=True)`` of the unpipelined model shows each autograd node
(``AddmmBackward0``, a custom Function's ``TwiceBackward``) in its module.

Here, at function level, while grad is on (the step's ``enable_grad``; a capture's forward is
otherwise under ``no_grad`` and pays one check per op), the ``grad_fn`` of each recorded call's
outputs and arguments is mapped to the node that made the tensor (a custom Function sets its
output's ``grad_fn`` after its forward's ops ran: the node that made the tensor). When the forward
calls ``torch.autograd.backward`` or ``Tensor.backward``, the autograd graph is walked from the
tensors it is given, before it runs: each autograd node is an op of phase ``backward``, named by
its class as ``capture(backward=True)`` names them, in the module call of the forward op it
differentiates (else in that of the node that hands it its gradient: ``attrs["stack_inferred"]``),
in the order the engine runs them (torch's profiler records the same sequence); ``AccumulateGrad``
names the parameter (``attrs["grad_of"]``), in the call whose backward op made its gradient. Hooks on the autograd nodes record each node's
gradient shapes as the real backward runs; they are removed when the trace ends.
"""

from __future__ import annotations

import heapq
import re
from typing import Any

import torch

from fxviz.fallback.tensors import tensor_meta
from fxviz.ir import Node, Ref

_plain = torch._C.DisableTorchFunction


class OwnBackward:
    """What one recording knows of the autograd graph its forward builds, and the backward nodes it
    adds where the forward runs a backward (module docstring)."""

    def __init__(self, rec: Any) -> None:
        self.rec = rec  # the Recorder
        self.fn_node: dict[Any, Ref] = {}  # grad_fn -> the recorded output it belongs to
        self.handles: list[Any] = []
        self.runs = 0  # backward calls the forward made

    def note(self, args: tuple[Any, ...], outs: tuple[Any, ...], name: str) -> None:
        """A call recorded as node ``name`` ran with grad on: map its outputs' ``grad_fn``, and
        any argument's set since it was made (a custom Function's output)."""
        fn_node, values = self.fn_node, self.rec.versions.values
        with _plain():
            for a in args:
                gf = a.grad_fn if isinstance(a, torch.Tensor) else None
                if gf is not None and gf not in fn_node:
                    e = values.get(a)
                    if e is not None:
                        fn_node[gf] = e[0]
            for k, o in enumerate(outs):
                gf = o.grad_fn if isinstance(o, torch.Tensor) else None
                if gf is not None and gf not in fn_node:
                    fn_node[gf] = Ref(name, k)

    def before(self, target: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """``torch.autograd.backward(tensors, grad_tensors)`` or ``tensor.backward(gradient)`` is
        about to run: add its autograd nodes (module docstring)."""
        with _plain():
            if target == "Tensor.backward":
                roots, grads = [args[0]], [args[1] if len(args) > 1 else kwargs.get("gradient")]
            else:
                tensors = args[0] if args else kwargs.get("tensors")
                given = args[1] if len(args) > 1 else kwargs.get("grad_tensors")
                roots = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors or ())
                grads = [given] if isinstance(given, torch.Tensor) else list(given or [None] * len(roots))
            self.note(tuple(roots), (), "")
            self._add(roots, grads)

    def _add(self, roots: list[Any], grads: list[Any]) -> None:
        rec = self.rec
        values = rec.versions.values
        fns = [t.grad_fn for t in roots if isinstance(t, torch.Tensor)]
        seeds: dict[Any, list[Ref]] = {}
        for t, g in zip(roots, grads, strict=False):  # a root reads the gradient it is given (or itself: ones)
            if isinstance(t, torch.Tensor) and t.grad_fn is not None:
                e = values.get(g) if isinstance(g, torch.Tensor) else values.get(t)
                seeds.setdefault(t.grad_fn, []).extend([e[0]] if e is not None else [])
        if not seeds:
            return
        self.runs += 1
        order, consumers = walk([f for f in fns if f is not None])
        nodes = {n.name: n for n in rec.nodes}
        bnode: dict[Any, Node] = {}
        ran: dict[str, int] = {}
        for f in order:
            attrs: dict[str, Any] = {"seq_nr": f._sequence_nr(), "backward_run": self.runs}
            ins = [Ref(bnode[c].name, i) for c, i in consumers.get(f, []) if c in bnode] + seeds.get(f, [])
            var = getattr(f, "variable", None)
            fwd = self.fn_node.get(f)
            handed = [bnode[c] for c, _ in consumers.get(f, []) if c in bnode]
            stack = max(handed, key=lambda n: ran[n.name]).stack if handed else ()
            if isinstance(var, torch.Tensor):  # AccumulateGrad: in the call whose backward made the gradient
                e = values.get(var)
                of = nodes.get(e[0].node) if e is not None else None
                attrs["grad_of"] = of.target if of is not None else "input"
            elif fwd is not None and fwd.node in nodes:
                attrs["forward"] = fwd.node
                stack = nodes[fwd.node].stack
            else:  # in the module of the backward op that handed it its last gradient
                attrs["stack_inferred"] = True
            target = type(f).__name__
            node = Node(rec.names.unique(snake(target)), "op", target, tuple(ins), stack, attrs=attrs,
                        phase="backward")
            ran[node.name] = len(ran)
            bnode[f] = node
            rec.nodes.append(node)
            self.handles.append(f.register_hook(_shapes(node)))

    def close(self) -> None:
        """Hooks off, and the recorder let go: it and this hold each other, a cycle the recorder's
        own ``close`` must leave for reference counting to free, not the collector."""
        for h in self.handles:
            h.remove()
        self.handles.clear()
        self.fn_node.clear()
        self.rec = None


def _shapes(node: Node) -> Any:
    def post(grad_inputs: Any, _grad_outputs: Any) -> None:
        node.outputs = tuple(tensor_meta(g) for g in grad_inputs)
    return post


def snake(name: str) -> str:
    """A node's name from its autograd class: ``AddmmBackward0`` -> ``addmm_backward``."""
    name = re.sub(r"\d+$", "", name)
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower() or "backward"


def walk(roots: list[Any]) -> tuple[list[Any], dict[Any, list[tuple[Any, int]]]]:
    """Every autograd node reachable from ``roots``, in the order the engine runs them (a ready
    node by descending sequence number: ``AccumulateGrad``'s is the largest), and each node's
    consumers as (consumer, edge index)."""
    consumers: dict[Any, list[tuple[Any, int]]] = {r: [] for r in roots}
    todo, seen = list(roots), set(roots)
    while todo:
        f = todo.pop()
        for i, (g, _) in enumerate(f.next_functions):
            if g is None:
                continue
            consumers.setdefault(g, []).append((f, i))
            if g not in seen:
                seen.add(g)
                todo.append(g)
    waiting = {f: len({id(c) for c, _ in cs}) for f, cs in consumers.items()}
    heap: list[tuple[int, int, Any]] = []
    for k, r in enumerate(dict.fromkeys(roots)):
        if waiting[r] == 0:
            heap.append((-r._sequence_nr(), k, r))
    heapq.heapify(heap)
    order, k = [], len(heap)
    while heap:
        _, _, f = heapq.heappop(heap)
        order.append(f)
        for g in dict.fromkeys(g for g, _ in f.next_functions if g is not None):
            waiting[g] -= 1
            if waiting[g] == 0:
                heapq.heappush(heap, (-g._sequence_nr(), k, g))
                k += 1
    return order, consumers


__all__ = ["OwnBackward", "snake", "walk"]
