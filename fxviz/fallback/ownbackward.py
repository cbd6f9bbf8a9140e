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
from torch.autograd.graph import GradientEdge, get_gradient_edge

from fxviz.fallback.observe import PLAIN_TENSORS
from fxviz.fallback.tensors import tensor_meta
from fxviz.ir import ModuleCall, Node, Ref

Stack = tuple[ModuleCall, ...]

_plain = torch._C.DisableTorchFunction


class OwnBackward:
    """What one recording knows of the autograd graph its forward builds, and the backward nodes it
    adds where the forward runs a backward (module docstring)."""

    def __init__(self, rec: Any) -> None:
        self.rec = rec  # the Recorder
        self.fn_node: dict[Any, Ref] = {}  # grad_fn -> the recorded output it belongs to
        self.made_by: dict[Any, str] = {}  # grad_fn of a DTensor an unseen Function made -> its shard's node
        self.hooks: dict[Any, Any] = {}  # autograd node -> the handle of the hook of its latest run's node
        self.runs = 0  # backward calls the forward made
        #: autograd nodes that ran again in a backward no call the mode saw started (``torch.autograd.grad``
        #: given gradient edges only, as a zero-bubble schedule's weight pass is: torch hands such a
        #: call to no torch-function mode), at least; the graph says so in a note
        self.unseen = 0

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
                    elif type(a) not in PLAIN_TENSORS and (ref := self.rec._local_value(a)) is not None:
                        self.made_by.setdefault(gf, ref.node)  # a parallel style's redistribution in its hook
            for k, o in enumerate(outs):
                gf = o.grad_fn if isinstance(o, torch.Tensor) else None
                if gf is not None and gf not in fn_node:
                    fn_node[gf] = Ref(name, k)

    def before(self, target: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """``torch.autograd.backward(tensors, grad_tensors)``, ``tensor.backward(gradient)`` or
        ``torch.autograd.grad(outputs, inputs, grad_outputs)`` is about to run: add its autograd
        nodes (module docstring)."""
        with _plain():
            captured: set[Any] | None = None
            if target == "Tensor.backward":
                roots, grads = [args[0]], [args[1] if len(args) > 1 else kwargs.get("gradient")]
            elif target == "torch.autograd.grad":  # a zero-bubble schedule's input and weight passes
                roots = _listed(args[0] if args else kwargs.get("outputs"))
                grads = _listed(args[2] if len(args) > 2 else kwargs.get("grad_outputs")) or [None] * len(roots)
                captured = {_edge_node(x) for x in _listed(args[1] if len(args) > 1 else kwargs.get("inputs"))}
            else:
                tensors = args[0] if args else kwargs.get("tensors")
                given = args[1] if len(args) > 1 else kwargs.get("grad_tensors")
                roots = _listed(tensors)
                grads = _listed(given) or [None] * len(roots)
            self.note(tuple(r for r in roots if isinstance(r, torch.Tensor)), (), "")
            self._add(roots, grads, captured)

    def _add(self, roots: list[Any], grads: list[Any], captured: set[Any] | None = None) -> None:
        rec = self.rec
        values = rec.versions.values
        seeds: dict[Any, list[Ref]] = {}
        for t, g in zip(roots, grads, strict=False):  # a root reads the gradient it is given (or itself: ones)
            f = _edge_node(t) if isinstance(t, torch.Tensor | GradientEdge) else None
            if f is not None:
                e = values.get(g) if isinstance(g, torch.Tensor) else values.get(t) if isinstance(t, torch.Tensor) else None
                seeds.setdefault(f, []).extend([e[0]] if e is not None else [])
        if not seeds:
            return
        self.runs += 1
        order, consumers = walk(list(seeds), captured)
        nodes = {n.name: n for n in rec.nodes}
        bnode: dict[Any, Node] = {}
        ran: dict[str, int] = {}
        hands: dict[str, Stack] = {}
        for f in order:
            attrs: dict[str, Any] = {"seq_nr": f._sequence_nr(), "backward_run": self.runs}
            ins = [Ref(bnode[c].name, i) for c, i in consumers.get(f, []) if c in bnode] + seeds.get(f, [])
            var = getattr(f, "variable", None)
            fwd = self.fn_node.get(f)
            handed = [bnode[c] for c, _ in consumers.get(f, []) if c in bnode]
            stack = handed_stack(handed, ran, hands)
            if captured is not None and f in captured:  # torch.autograd.grad returns its gradient
                attrs["returned"] = True
            if isinstance(var, torch.Tensor):  # AccumulateGrad: in the call whose backward made the gradient
                e = values.get(var)
                of = nodes.get(e[0].node) if e is not None else None
                attrs["grad_of"] = of.target if of is not None else "input"
            elif fwd is not None and fwd.node in nodes:
                attrs["forward"] = fwd.node
                stack = nodes[fwd.node].stack
            else:  # in the module of the backward op that handed it its last gradient
                attrs["stack_inferred"] = True
                made = self.made_by.get(f)
                if made in nodes:  # as fxviz's own backward places it (:func:`fxviz.fallback.backward.add_backward`)
                    attrs["made_by"] = made
                    stack = hooked_stack(stack, nodes[made].stack)
            target = type(f).__name__
            node = Node(rec.names.unique(snake(target)), "op", target, tuple(ins), stack, attrs=attrs,
                        phase="backward")
            ran[node.name] = len(ran)
            hands_on(node, handed, ran, hands)
            bnode[f] = node
            rec.nodes.append(node)
            old = self.hooks.pop(f, None)
            if old is not None:  # it ran in an earlier run the mode saw (retain_graph): that node is done
                old.remove()
            self.hooks[f] = f.register_hook(self._shapes(node))

    def close(self) -> None:
        """Hooks off, and the recorder let go: it and this hold each other, a cycle the recorder's
        own ``close`` must leave for reference counting to free, not the collector."""
        for h in self.hooks.values():
            h.remove()
        self.hooks.clear()
        self.fn_node.clear()
        self.made_by.clear()
        self.rec = None


    def _shapes(self, node: Node) -> Any:
        """The hook that records the gradients ``node``'s autograd node hands on when it runs; a
        second run of it is one of a backward the mode did not see (:attr:`unseen`)."""
        ran = [False]

        def post(grad_inputs: Any, _grad_outputs: Any) -> None:
            if ran[0]:
                self.unseen += 1
                return
            ran[0] = True
            node.outputs = tuple(tensor_meta(g) for g in grad_inputs)
        return post


def unseen_note(own: OwnBackward | None) -> str | None:
    """The graph's note when the forward ran a backward the mode did not see (:attr:`OwnBackward.unseen`)."""
    if own is None or not own.unseen:
        return None
    return (f"the forward ran backward passes torch hands to no torch-function mode (torch.autograd.grad given "
            f"gradient edges only, as a zero-bubble pipeline schedule's weight passes are): at least {own.unseen} "
            "autograd nodes ran in them that the graph does not show; torch's profiler lists every node that ran "
            "(autograd::engine::evaluate_function)")


HOOK = "BackwardHookFunctionBackward"  # a module's full backward hooks: identity, hands on its gradient


def handed_stack(handed: list[Node], ran: dict[str, int], hands: dict[str, Stack]) -> Stack:
    """The module stack of the backward op that handed a node its last gradient (the one run just
    before it). A module's full backward hook node (``register_full_backward_hook``, and the one
    ``CommDebugMode`` puts on every module) hands on what it was handed, so it is looked through:
    a hook on ``mlp`` must not move its input redistribution's reduce-scatter from ``gate_proj``
    (where ``CommDebugMode`` counts it) to ``mlp``. ``hands`` maps each node to the stack it hands on."""
    if not handed:
        return ()
    last = max(handed, key=lambda n: ran[n.name])
    return hands.get(last.name, last.stack)


def hooked_stack(handed: Stack, own: Stack) -> Stack:
    """The module of a redistribution's backward that a parallel style's output hook made in
    ``own``'s module: where its gradient comes from outside that module (a row-parallel
    ``use_local_output=False`` output read by the next module), that module, whose backward has
    begun (torch's full backward pre-hooks fire on the hooked output, and ``CommDebugMode`` counts it
    there); else the module that ``handed`` it its last gradient."""
    return handed if handed[:len(own)] == own else own


def hands_on(node: Node, handed: list[Node], ran: dict[str, int], hands: dict[str, Stack]) -> None:
    """Record the stack ``node`` hands on: its own, or for a hook node what it was handed."""
    hands[node.name] = handed_stack(handed, ran, hands) if node.target == HOOK and handed else node.stack


def snake(name: str) -> str:
    """A node's name from its autograd class: ``AddmmBackward0`` -> ``addmm_backward``."""
    name = re.sub(r"\d+$", "", name)
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower() or "backward"


def walk(roots: list[Any], captured: set[Any] | None = None) -> tuple[list[Any], dict[Any, list[tuple[Any, int]]]]:
    """Every autograd node the engine evaluates from ``roots``, in the order it runs them (a ready
    node by descending sequence number: ``AccumulateGrad``'s is the largest), and each node's
    consumers as (consumer, edge index). With ``captured`` (``torch.autograd.grad``'s inputs), only
    the nodes torch's engine evaluates: those that lead to a captured one, and the captured ones,
    which hand their gradient back and run nothing below them unless they lead to another."""
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
    needed = _needed(consumers, captured) if captured is not None else None
    runs = (lambda f: True) if needed is None else (lambda f: f in needed or f in captured)  # type: ignore[operator]
    heap: list[tuple[int, int, Any]] = []
    for k, r in enumerate(dict.fromkeys(roots)):
        if waiting[r] == 0 and runs(r):
            heap.append((-r._sequence_nr(), k, r))
    heapq.heapify(heap)
    order, k = [], len(heap)
    while heap:
        _, _, f = heapq.heappop(heap)
        order.append(f)
        if needed is not None and f not in needed:
            continue  # captured only: its gradient is returned, nothing below it runs
        for g in dict.fromkeys(g for g, _ in f.next_functions if g is not None):
            waiting[g] -= 1
            if waiting[g] == 0 and runs(g):
                heapq.heappush(heap, (-g._sequence_nr(), k, g))
                k += 1
    return order, consumers


def _needed(consumers: dict[Any, list[tuple[Any, int]]], captured: set[Any]) -> set[Any]:
    """The nodes that lead to a captured one (the engine's ``exec_info`` ``needed_``): the
    consumers, transitively, of every captured node reached."""
    needed: set[Any] = set()
    todo = [f for f in captured if f in consumers]
    while todo:
        for c, _ in consumers[todo.pop()]:
            if c not in needed:
                needed.add(c)
                todo.append(c)
    return needed


def _listed(x: Any) -> list[Any]:
    """A tensor, a gradient edge or a sequence of them (or ``None``) as a list."""
    if x is None:
        return []
    return [x] if isinstance(x, torch.Tensor | GradientEdge) else list(x)


def _edge_node(x: Any) -> Any:
    """The autograd node a gradient edge or a tensor's gradient goes to: its ``grad_fn``, or a
    leaf's gradient accumulator."""
    if isinstance(x, GradientEdge):
        return x.node
    return get_gradient_edge(x).node if x.requires_grad else None


__all__ = ["OwnBackward", "snake", "unseen_note", "walk"]
