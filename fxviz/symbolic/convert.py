"""torch.fx graph -> fxviz IR: the one converter behind every symbolic capture method.

Torch objects stop here: fake tensors become :class:`TensorMeta`, ``nn_module_stack`` becomes the
node's module call stack, ``stack_trace`` becomes a :class:`SourceLoc`, and ``getitem`` on a
multi-output op becomes an indexed :class:`Ref` instead of a node of its own.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch import nn

from fxviz.ir import ModuleCall, Node, NodeKind, Ref, TensorMeta
from fxviz.symbolic.hops import body_of, convert_hop, inferred_stack, is_hop, mark_checkpoints
from fxviz.torchbridge.checkpoint import STAMP
from fxviz.torchbridge.opnames import function_name, op_target
from fxviz.torchbridge.source import source_from_trace
from fxviz.torchbridge.values import json_safe, metas_from_val, output_node


def target_name(node: torch.fx.Node, modules: dict[str, nn.Module] | None = None) -> str:
    """``aten.linear.default``, ``torch.relu``, ``operator.add``, ``Tensor.view``, ``Conv2d``."""
    t = node.target
    if node.op == "call_method":
        return f"Tensor.{t}"
    if node.op == "call_module":
        mod = (modules or {}).get(str(t))
        return type(mod).__name__ if mod is not None else str(t)
    op = op_target(t)
    if op is not None:
        return op
    if callable(t):
        try:
            name = torch.overrides.resolve_name(t)
        except Exception:  # resolve_name walks torch's namespaces; anything odd just falls through
            name = None
        if name:
            return name
        owner = str(getattr(t, "__module__", None) or "")
        qual = str(getattr(t, "__qualname__", None) or getattr(t, "__name__", None) or repr(t))
        return f"{owner}.{qual}" if owner and owner != "builtins" else qual
    return str(t)


def _call_name(name: str, target: str) -> str:
    """The torch-level call's name as the eager tracer spells it (and a user writes it). Export
    names the call by its Python class and name (``builtin_function_or_method.relu``): the function
    of that name and class in torch's namespaces is the one (``torch.relu``,
    ``torch.nn.functional.linear``, ``Tensor.view``). A call of a dispatcher op
    (``OpOverload.scaled_swish.default``) drops the namespace; when that op is the node's own, its
    target says it (``mylib::scaled_swish.default``)."""
    kind, _, rest = name.partition(".")
    if kind in ("OpOverload", "OpOverloadPacket") and rest and target.endswith(("::" + rest, "." + rest)):
        return target
    return _torch_spelling(kind, rest) or name


@functools.cache
def _torch_spelling(cls: str, fn: str) -> str | None:
    """``torch.relu`` for (``builtin_function_or_method``, ``relu``): the first function called
    ``fn`` of class ``cls`` in torch's namespaces, as the eager tracer names it; ``None``: none."""
    if not fn or "." in fn:
        return None
    for ns in (torch, torch.nn.functional, torch.Tensor, torch.special, torch.linalg, torch.fft):
        obj = getattr(ns, fn, None)
        if obj is not None and type(obj).__name__ == cls:
            return function_name(obj)
    return None


def argument_names(node: torch.fx.Node) -> list[str] | None:
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return None
    return [a.name for a in schema.arguments]


def split_arguments(
    node: torch.fx.Node, ref_of: Callable[[torch.fx.Node], Ref | None]
) -> tuple[tuple[Ref, ...], dict[str, Any]]:
    """A node's fx arguments -> (inputs in argument order, JSON-safe non-tensor attrs)."""
    inputs: list[Ref] = []
    attrs: dict[str, Any] = {}
    names = argument_names(node) or []

    def collect(v: Any) -> Any:
        if isinstance(v, torch.fx.Node):
            r = ref_of(v)
            if r is not None:
                inputs.append(r)
            return f"%{r.node}" if r is not None else None
        if isinstance(v, (list, tuple)):
            return [collect(x) for x in v]
        if isinstance(v, dict):
            return {str(k): collect(x) for k, x in v.items()}
        return json_safe(v)

    for i, a in enumerate(node.args):
        rendered = collect(a)
        if not isinstance(a, torch.fx.Node):
            attrs[names[i] if i < len(names) else f"arg{i}"] = rendered
    for k, a in node.kwargs.items():
        rendered = collect(a)
        if not isinstance(a, torch.fx.Node):
            attrs[k] = rendered
    return tuple(inputs), attrs


#: What strict export calls the model it traces, in the module stacks of higher-order ops' bodies.
EXPORT_ROOT = "_export_root"


def stack_from_meta(nn_module_stack: dict[str, Any] | None, strip: str) -> tuple[ModuleCall, ...]:
    """``nn_module_stack`` -> ((path, call index), ...) without the root model.

    Keys end in ``@N`` for the N-th repeated call; values hold the fully qualified path. ``strip``
    is the wrapper prefix to remove (``"model"``), or ``""`` when the model was traced directly.
    """
    if not nn_module_stack:
        return ()
    out: list[ModuleCall] = []
    for key, value in nn_module_stack.items():
        path = value[0] if isinstance(value, tuple) else str(value)
        # strict export names the model it traces ``_export_root`` inside higher-order op bodies
        if path == EXPORT_ROOT:
            continue
        path = path.removeprefix(EXPORT_ROOT + ".")
        if strip:
            if path == strip or path == "":
                continue
            if not path.startswith(strip + "."):
                continue
            path = path[len(strip) + 1 :]
        elif path == "":
            continue
        _, at, idx = str(key).rpartition("@")
        out.append((path, int(idx) if at and idx.isdigit() else 0))
    return tuple(out)


@dataclass
class Placeholder:
    """What a placeholder of the fx graph stands for."""

    kind: NodeKind
    name: str  # the IR node's name
    target: str  # state-dict name or argument path
    phase: str = "forward"  # "backward" for a joint graph's tangent (the loss's gradient)


@dataclass
class Converter:
    """Builds IR nodes from one fx graph, and from the bodies of its higher-order ops.

    ``placeholders`` maps fx placeholder names to what they are; ``strip`` is the wrapper prefix in
    module paths; ``modules`` resolves ``call_module`` targets (fx) and tells which modules are
    containers that never run (when a body's module stack has to be inferred); ``taken`` holds,
    per ``cond`` node, the branch the example inputs take (when they were run).
    """

    placeholders: dict[str, Placeholder]
    strip: str = ""
    modules: dict[str, nn.Module] = field(default_factory=dict)
    taken: dict[torch.fx.Node, bool] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)
    refs: dict[torch.fx.Node, Ref] = field(default_factory=dict)
    used_names: set[str] = field(default_factory=set)
    by_name: dict[str, Node] = field(default_factory=dict)
    state_refs: dict[str, Ref] = field(default_factory=dict)
    # higher-order ops (fxviz.symbolic.hops): the GraphModule a get_attr node names, what each
    # output of a higher-order op is, the module calls a body inherits, the stack traces that
    # pass through torch.utils.checkpoint, and a counter for region ids
    bodies: dict[torch.fx.Node, torch.fx.GraphModule] = field(default_factory=dict)
    multi: dict[torch.fx.Node, list[Ref | None]] = field(default_factory=dict)
    inherit: list[tuple[ModuleCall, ...]] = field(default_factory=list)
    traces: dict[str, str] = field(default_factory=dict)
    regions: int = 0
    stacks: dict[tuple[str, ...], tuple[ModuleCall, ...]] = field(default_factory=dict)  # by nn_module_stack keys

    def unique(self, name: str) -> str:
        base, i = name, 1
        while name in self.used_names:
            name = f"{base}_{i}"
            i += 1
        self.used_names.add(name)
        return name

    def add(self, node: Node) -> Node:
        self.nodes.append(node)
        self.by_name[node.name] = node
        return node

    def ref_of(self, n: torch.fx.Node) -> Ref | None:
        return self.refs.get(n)

    def _state_kind(self, name: str) -> NodeKind:
        """What an attribute a ``get_attr`` node reads is: a parameter or buffer of one of the
        model's modules (fx reads ``self.weight`` of a module it traces through that way), else a
        constant (export's lifted tensors)."""
        path, _, attr = name.rpartition(".")
        mod = self.modules.get(path)
        if mod is not None and attr in getattr(mod, "_parameters", {}):
            return "parameter"
        if mod is not None and attr in getattr(mod, "_buffers", {}):
            return "buffer"
        return "constant"

    def state_node(self, kind: NodeKind, state_name: str, value: Any) -> Ref:
        # one node per parameter, however many calls read it (fx: a module called twice)
        if state_name in self.state_refs:
            return self.state_refs[state_name]
        owner = state_name.rpartition(".")[0]
        node = self.add(
            Node(
                self.unique(state_name),
                kind,
                target=state_name,
                stack=((owner, 0),) if owner else (),
                outputs=metas_from_val(value),
            )
        )
        self.state_refs[state_name] = Ref(node.name)
        return self.state_refs[state_name]

    def convert(self, graph: torch.fx.Graph, owner: torch.fx.GraphModule | None = None) -> None:
        """Convert the top-level graph (``owner``: the GraphModule holding it, which resolves the
        bodies of higher-order ops); then mark the ops that ran inside ``torch.utils.checkpoint``."""
        for n in graph.nodes:
            if n.op == "placeholder":
                ph = self.placeholders.get(n.name) or Placeholder("input", n.name, n.name)
                node = Node(
                    self.unique(ph.name), ph.kind, target=ph.target,
                    stack=self._state_stack(ph) if ph.kind != "input" else (),
                    outputs=metas_from_val(n.meta.get("val")), phase=ph.phase,
                )
                self.refs[n] = Ref(self.add(node).name)
            elif n.op != "output":
                self.convert_node(n, owner)
        mark_checkpoints(self)

    def convert_node(self, n: torch.fx.Node, owner: torch.fx.GraphModule | None) -> None:
        """One node that is neither a placeholder nor the output: a body of a higher-order op, a
        constant, an element of a multi-output op, a higher-order op or an op."""
        if n.op == "get_attr":
            body = body_of(owner, str(n.target))
            if body is not None:
                self.bodies[n] = body
                return
            value = n.meta.get("val")
            name = self._strip_name(str(n.target))
            self.refs[n] = self.state_node(self._state_kind(name), name, value)
        elif n.op == "call_function" and n.target is operator.getitem and n.args[0] in self.multi:
            items = self.multi[n.args[0]]  # type: ignore[index]
            i = n.args[1]
            ref = items[i] if isinstance(i, int) and 0 <= i < len(items) else None
            if ref is not None:
                self.refs[n] = ref
        elif n.op == "call_function" and n.target is operator.getitem and self._is_multi(n):
            src = self.refs[n.args[0]]  # type: ignore[index]
            i = int(n.args[1])  # type: ignore[arg-type]
            self.refs[n] = Ref(src.node, i + len(self.by_name[src.node].outputs) if i < 0 else i)  # x.shape[-1]
        elif n.op == "call_function" and is_hop(self, n):
            convert_hop(self, n)
        elif n.op in ("call_function", "call_method", "call_module"):
            self.refs[n] = Ref(self.add(self.op_node(n)).name)

    def stack_of(self, n: torch.fx.Node, inputs: tuple[Ref, ...]) -> tuple[ModuleCall, ...]:
        """The module calls ``n`` ran in. Inside a body of a higher-order op that export traced
        without them (non-strict cond, while_loop, map): the calls around the op, and the owner of
        a parameter ``n`` reads (:func:`~fxviz.symbolic.hops.inferred_stack`). A backward op of a
        joint graph (:mod:`fxviz.symbolic.joint`) runs in the call of the forward op it differentiates
        (torch's ``fwd_nn_module_stack``)."""
        meta = n.meta.get("nn_module_stack") or n.meta.get("fwd_nn_module_stack")
        key = tuple(meta) if meta else ()
        stack = self.stacks.get(key)
        if stack is None:  # one tuple per call: nodes of a call 2,000 modules deep share it
            stack = self._new_stack(key, meta)  # type: ignore[arg-type]
        if self.inherit and not stack:
            return inferred_stack(self, inputs)
        return stack

    def _new_stack(self, key: tuple[str, ...], meta: dict[str, Any]) -> tuple[ModuleCall, ...]:
        """:func:`stack_from_meta` of a call's stack, from the stack of the nearest enclosing call
        already converted (usually one or two levels up) and one entry per level below it, each
        level's stack kept: converting every level of every call costs the square of the depth."""
        if not key:
            self.stacks[key] = ()
            return ()
        k = len(key) - 1
        while k > 0 and key[:k] not in self.stacks:
            k -= 1
        stack = self.stacks[key[:k]] if k > 0 else ()
        for d in range(k, len(key)):
            stack = self.stacks[key[:d + 1]] = stack + stack_from_meta({key[d]: meta[key[d]]}, self.strip)
        return stack

    def _is_multi(self, n: torch.fx.Node) -> bool:
        src = n.args[0]
        if not (isinstance(src, torch.fx.Node) and isinstance(n.args[1], int) and src in self.refs):
            return False
        count = len(self.by_name[self.refs[src].node].outputs)
        return count > 1 and -count <= n.args[1] < count

    def op_node(self, n: torch.fx.Node) -> Node:
        inputs, attrs = split_arguments(n, self.ref_of)
        stack = self.stack_of(n, inputs)
        if self.inherit and stack != self.inherit[-1] and not n.meta.get("nn_module_stack"):
            attrs["stack_inferred"] = True
        if n.op == "call_module":
            path = str(n.target)
            mod = self.modules.get(path)
            stack = self._module_call_stack(stack, path)
            if mod is not None:
                for pname, p in mod.named_parameters(recurse=True):
                    inputs += (self.state_node("parameter", f"{path}.{pname}", p),)
                for bname, b in mod.named_buffers(recurse=True):
                    inputs += (self.state_node("buffer", f"{path}.{bname}", b),)
        target = target_name(n, self.modules)
        torch_fn = n.meta.get("torch_fn")
        if torch_fn:
            # [call id, name]: the ATen ops of one torch-level call share the id, also after
            # run_decompositions, so a comparison can fold them back to the call
            attrs["torch_fn"] = [str(torch_fn[0]), _call_name(str(torch_fn[1]), target)]
        trace = n.meta.get("stack_trace")
        tag = n.meta.get("partitioner_tag")  # a joint graph's: is_forward / is_backward
        if tag is not None and "seq_nr" in n.meta:
            attrs["seq_nr"] = n.meta["seq_nr"]  # shared by a forward op and the backward ops of it
        if STAMP in n.meta:  # the checkpoint call non-strict export traced it in
            attrs["checkpoint"] = n.meta[STAMP]
        node = Node(
            self.unique(n.name),
            "op",
            target=target,
            inputs=inputs,
            stack=stack,
            outputs=self._op_outputs(n),
            source=source_from_trace(trace),
            attrs=attrs,
            phase="backward" if tag == "is_backward" else "forward",
        )
        if trace and "checkpoint" in trace:  # torch.utils.checkpoint, or a call of it: see hops
            self.traces[node.name] = trace
        return node

    @staticmethod
    def _op_outputs(n: torch.fx.Node) -> tuple[TensorMeta, ...]:
        # an op known to return nothing (``aten._assert_tensor_metadata``) says so; no "val" at all
        # stays empty, which the shapes pass reports as unknown
        if "val" in n.meta and n.meta["val"] is None:
            return (TensorMeta((), "none"),)
        return metas_from_val(n.meta.get("val"))

    def _module_call_stack(self, stack: tuple[ModuleCall, ...], path: str) -> tuple[ModuleCall, ...]:
        if stack and stack[-1][0] == path:
            return stack
        return (*stack, (path, 0))

    def _strip_name(self, name: str) -> str:
        return name[len(self.strip) + 1 :] if self.strip and name.startswith(self.strip + ".") else name

    def _state_stack(self, ph: Placeholder) -> tuple[ModuleCall, ...]:
        owner = ph.target.rpartition(".")[0]
        return ((owner, 0),) if owner else ()

    def add_outputs(self, items: Iterable[tuple[str, torch.fx.Node | None, str | None]]) -> None:
        """Output nodes: (path, fx node or None, description of a constant output)."""
        for path, fx_node, const in items:
            ref = self.refs.get(fx_node) if fx_node is not None else None
            self.add(output_node(self.unique(path), path, ref, const))
