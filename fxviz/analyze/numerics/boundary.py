"""The compiled side of ``compile[:backend]``: compilemap's recording backend, told for each Dynamo
graph where its values come from, and watching each call of it.

:class:`GraphSpec` reads a Dynamo graph once, when it is compiled: which of its inputs feed which
op (a value made by earlier code, compiled or eager, enters here), which op makes each of its
outputs (a value leaves here), and, with ``aot_eager``, which node of the AOT forward graph (ATen
level) carries each op's value: ATen nodes name the Dynamo node they were traced from
(``meta["from_node"]``); a torch-level op that became several ATen nodes is paired by its last node
whose value has the op's shape and dtype (``linear`` -> ``t``, ``addmm``: ``addmm``), the others are
inside it.

:class:`CompiledSide` wraps the real backend as the compile map does and hands each call of a
compiled graph to an observer (``observer.graph_call``); with ``aot_eager`` the AOT forward graph
runs in an fx Interpreter that shows the observer each node's value as it is made
(``observer.aten_value``, which may hand back another value: a random op is given eager's draw).
With no observer the graphs run as compiled.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.fx
from torch.utils import _pytree as pytree

from fxviz.analyze.compilemap.record import Recorder, op_nodes
from fxviz.analyze.numerics.pairing import Reads, passes_through
from fxviz.analyze.numerics.run import zero_unwritten
from fxviz.ops import op_name


class Observer(Protocol):
    def graph_call(self, index: int, call: Callable[..., Any], args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> Any: ...

    def aten_value(self, node: torch.fx.Node, value: Any) -> Any: ...

    def watching_aten(self) -> bool: ...


@dataclass(slots=True)
class GraphSpec:
    """What one Dynamo graph's calls show, by the index of each op in :func:`op_nodes` order.

    ``inputs``: (placeholder position, op index, position among the op's tensor arguments) for each
    tensor input, at its first use; ``arity``: each op's number of tensor arguments (the eager op
    must read as many for the positions to agree); ``outputs``: (op index, output index) for each
    flat output, ``None`` where no op makes it (an input handed back, a constant). With
    ``aot_eager``, ``values``: ATen node name -> op index, the node that carries the op's value;
    ``inside``: ATen nodes inside a decomposed op or a tuple's ``getitem``; ``orphans``: ATen nodes
    whose op could not be told. ``reads``: what each op reads (other ops, parameters and buffers by
    path), to tell apart ops of one source line (:mod:`~fxviz.analyze.numerics.pairing`)."""

    inputs: list[tuple[int, int, int]]
    arity: list[int]
    outputs: list[tuple[int, int] | None]
    structural: set[int]
    reads: Reads
    values: dict[str, int] = field(default_factory=dict)
    inside: int = 0
    orphans: int = 0
    aten: bool = False

    @classmethod
    def of(cls, gm: torch.fx.GraphModule, tensors: Mapping[int, str] | None = None) -> GraphSpec:
        """``gm``'s spec; ``tensors``: ``id()`` -> path of the model's parameters and buffers."""
        ops = op_nodes(gm)
        index = {n: i for i, n in enumerate(ops)}
        inputs = []
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        for p, ph in enumerate(placeholders):
            users = sorted(index[u] for u in ph.users if u in index)
            if not users or not _tensor(ph):
                continue
            j = users[0]
            inputs.append((p, j, _tensor_args(ops[j]).index(ph)))
        outputs: list[tuple[int, int] | None] = []
        out = gm.graph.output_node()
        written = _last_writes(ops)
        for leaf in pytree.tree_leaves(out.args[0] if out.args else ()):
            spec = None
            if isinstance(leaf, torch.fx.Node) and leaf in written:
                spec = (index[written[leaf]], 0)
            elif isinstance(leaf, torch.fx.Node) and leaf in index:
                whole = _tuple_item(leaf)
                if whole is not None and whole[0] in index:
                    spec = (index[whole[0]], whole[1])
                elif _tensor(leaf):
                    spec = (index[leaf], 0)
            outputs.append(spec)
        structural = {i for i, n in enumerate(ops) if _tuple_item(n) is not None}
        return cls(inputs, [len(_tensor_args(n)) for n in ops], outputs, structural,
                   _reads(gm, ops, index, tensors or {}))

    def align(self, aten: torch.fx.GraphModule, gm: torch.fx.GraphModule) -> None:
        """Pair the nodes of ``aten`` (the AOT forward graph of ``gm``) with ``gm``'s ops."""
        ops = op_nodes(gm)
        names = {n.name: i for i, n in enumerate(ops)}
        by_op: dict[int, list[torch.fx.Node]] = {}
        for n in aten.graph.nodes:
            if n.op != "call_function":
                continue
            j = _origin(n, names, id(gm.graph))
            if j is None:
                self.orphans += 1
            else:
                by_op.setdefault(j, []).append(n)
        for j, nodes in by_op.items():
            fit = [] if j in self.structural else \
                [n for n in nodes if _fits(n.meta.get("val"), _value(ops[j]))]
            if fit:
                self.values[fit[-1].name] = j
                self.inside += len(nodes) - 1
            elif j in self.structural:
                self.inside += len(nodes)
            else:
                self.orphans += len(nodes)
        self.aten = True


def _reads(gm: torch.fx.GraphModule, ops: list[torch.fx.Node], index: Mapping[torch.fx.Node, int],
           tensors: Mapping[int, str]) -> Reads:
    """What each op reads: the ops, and the model's parameters and buffers (a placeholder's real
    tensor, ``meta["grapharg"].example``, or a ``get_attr``'s), by path."""
    source: dict[torch.fx.Node, str] = {}
    for n in gm.graph.nodes:
        t = None
        if n.op == "placeholder" and n.meta.get("grapharg") is not None:
            try:
                t = n.meta["grapharg"].example
            except Exception:  # noqa: BLE001 - a symbolic or freed input: no path to read
                t = None
        elif n.op == "get_attr":
            t = getattr(gm, str(n.target), None)
        if isinstance(t, torch.Tensor) and id(t) in tensors:
            source[n] = tensors[id(t)]
    reads, anchors = [], []
    for n in ops:
        args = n.all_input_nodes
        reads.append([index[a] for a in args if a in index])
        anchors.append(frozenset(source[a] for a in args if a in source))
    return Reads(reads, anchors, [passes_through(str(n.target) if n.op == "call_method"
                                                 else getattr(n.target, "__name__", str(n.target))) for n in ops])


def _last_writes(ops: list[torch.fx.Node]) -> dict[torch.fx.Node, torch.fx.Node]:
    """Each op whose tensor a later op of the graph writes in place (``buf.copy_(x)``,
    ``buf.add_(y)``) -> the last op that writes it: the graph hands the tensor out as that write left
    it, so that op's eager value is what the output is compared with (a cache's ``torch.zeros``
    filled by ``copy_``, as Mamba's, is not zeros when it leaves the graph)."""
    last: dict[torch.fx.Node, torch.fx.Node] = {}
    for n in ops:
        name = str(n.target) if n.op == "call_method" else getattr(n.target, "__name__", "")
        if not (name.endswith("_") and not name.endswith("__")) or not n.args:
            continue
        dst = n.args[0]
        if isinstance(dst, torch.fx.Node) and _tensor(n) and n.meta["example_value"].shape == _value(dst).shape:
            last[dst] = n
    return last


def _tensor(n: Any) -> bool:
    return isinstance(n, torch.fx.Node) and isinstance(n.meta.get("example_value"), torch.Tensor)


def _tensor_args(n: torch.fx.Node) -> list[torch.fx.Node]:
    return [a for a in pytree.tree_leaves((n.args, n.kwargs)) if _tensor(a)]


def _tuple_item(n: torch.fx.Node) -> tuple[torch.fx.Node, int] | None:
    """``(op, k)`` for ``op(...)[k]`` on an op that returns a tuple (``split``): Python's indexing,
    no torch op; the eager tracer numbers the op's outputs instead."""
    if n.op == "call_function" and n.target is operator.getitem and len(n.args) == 2:
        whole, k = n.args
        if isinstance(whole, torch.fx.Node) and isinstance(whole.meta.get("example_value"), (tuple, list)) \
                and isinstance(k, int):
            return whole, k
    return None


def _origin(n: torch.fx.Node, names: Mapping[str, int], graph_id: int) -> int | None:
    """The index of the Dynamo op an ATen node was traced from (``meta["from_node"]``, searched
    breadth first: a later pass wraps the earlier provenance)."""
    queue = list(n.meta.get("from_node") or ())
    fallback = None
    while queue:
        s = queue.pop(0)
        if s.name in names:
            if s.graph_id == graph_id:
                return names[s.name]
            fallback = names[s.name] if fallback is None else fallback
        queue.extend(s.from_node)
    return fallback


def _value(n: torch.fx.Node) -> Any:
    """What a Dynamo op's value is: its example value, or for ``x[i] = v`` (which returns nothing)
    the tensor it wrote."""
    if n.op == "call_function" and n.target is operator.setitem and n.args and isinstance(n.args[0], torch.fx.Node):
        return n.args[0].meta.get("example_value")
    return n.meta.get("example_value")


def _fits(val: Any, example: Any) -> bool:
    """Whether an ATen node's value has the shape of the Dynamo op's value (dtype too)."""
    if isinstance(val, torch.Tensor) and isinstance(example, torch.Tensor):
        return tuple(val.shape) == tuple(example.shape) and val.dtype == example.dtype
    if isinstance(val, (tuple, list)) and isinstance(example, (tuple, list)):
        return len(val) == len(example) and all(_fits(a, b) for a, b in zip(val, example, strict=True))
    return False


class _Stepper(torch.fx.Interpreter):
    """Runs an AOT forward graph node by node, each value shown to ``hook`` (which may replace it);
    each value is freed after its last use, as the compiled graph would."""

    def __init__(self, gm: torch.fx.GraphModule, hook: Callable[[torch.fx.Node, Any], Any]) -> None:
        super().__init__(gm, garbage_collect_values=True)
        self.hook = hook

    def run_node(self, n: torch.fx.Node) -> Any:
        value = super().run_node(n)
        if n.op == "call_function":
            zero_unwritten(op_name(str(n.target)), value)
        return self.hook(n, value) if n.op == "call_function" else value


class CompiledSide(Recorder):
    """compilemap's recording backend (ops, run order, breaks) with each graph's :class:`GraphSpec`
    and its calls handed to ``observer``. ``per_node`` (backend ``aot_eager``): the graph goes
    through AOT Autograd as ``aot_eager`` does, its forward graph run by an fx Interpreter;
    ``decompositions`` are given to AOT Autograd; ``tensors``: ``id()`` -> path of the model's
    parameters and buffers (what the ops of each graph read)."""

    def __init__(self, backend: str | Callable[..., Any], paths: dict[int, str], *, per_node: bool,
                 decompositions: Mapping[Any, Any] | None = None, tensors: Mapping[int, str] | None = None) -> None:
        super().__init__(backend, None, None, paths)
        self.tensors = dict(tensors or {})
        self.specs: list[GraphSpec] = []
        self.observer: Observer | None = None
        self.decompositions = dict(decompositions or {})
        if per_node:
            self.real = self._aot

    def backend(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        index = len(self.specs)
        self.specs.append(GraphSpec.of(gm, self.tensors))
        run = super().backend(gm, example_inputs)

        def call(*args: Any, **kwargs: Any) -> Any:
            obs = self.observer
            return run(*args, **kwargs) if obs is None else obs.graph_call(index, run, args, kwargs)

        if getattr(run, "_boxed_call", False):
            call._boxed_call = True  # type: ignore[attr-defined]
        return call

    def _aot(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        spec = self.specs[-1]

        def forward(aten: torch.fx.GraphModule, _: list[Any]) -> Callable[..., Any]:
            spec.align(aten, gm)

            def run(args: list[Any]) -> Any:
                values = list(args)
                args.clear()  # the boxed convention: the caller's list goes, the inputs die with their last use
                obs = self.observer
                if obs is None or not obs.watching_aten():
                    return aten(*values)
                return _Stepper(aten, obs.aten_value).run(*values)

            run._boxed_call = True  # type: ignore[attr-defined]
            return run

        if not self.decompositions:
            from torch._dynamo.backends.debugging import aot_eager

            return aot_eager(gm, example_inputs, fw_compiler=forward)
        # aot_eager's own settings, with the decompositions added (aot_eager takes none)
        from functorch.compile import min_cut_rematerialization_partition
        from torch._dynamo.backends.common import aot_autograd
        from torch._dynamo.backends.debugging import boxed_nop

        return aot_autograd(fw_compiler=forward, bw_compiler=boxed_nop, partition_fn=min_cut_rematerialization_partition,
                            keep_inference_input_mutations=True, decompositions=self.decompositions)(gm, example_inputs)


__all__ = ["CompiledSide", "GraphSpec", "Observer"]
