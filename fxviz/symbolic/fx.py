"""Capture through ``torch.fx.symbolic_trace`` -> IR; shapes from fake-tensor propagation."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import inspect
import linecache
import reprlib
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx
import torch.fx.traceback
import torch.utils._python_dispatch
from torch import nn
from torch.nn.utils.stateless import _reparametrize_module

from fxviz.ir import Graph, ModuleCall
from fxviz.symbolic.convert import Converter, Placeholder
from fxviz.symbolic.silent import opaque_note, with_silent_calls
from fxviz.torchbridge.checks import confirm_forward, first_line, real_inputs
from fxviz.torchbridge.guard import Backups, named_modules
from fxviz.torchbridge.normalize import FlatInputs, flatten_inputs, flatten_outputs, holds_tensors
from fxviz.torchbridge.source import is_user_file
from fxviz.torchbridge.values import mark_tied, module_infos
from fxviz.torchbridge.walk import named_state


class _RealWrites(torch.utils._python_dispatch.TorchDispatchMode):
    """The model's parameters and buffers that an op writes for real while fx traces: a loop over
    ``self.parameters()`` hands the forward real tensors, not proxies, so ``p.mul_(0.9)`` runs on the
    model and fx records nothing. Each is backed up before its first write (found by storage, its
    schema's written arguments, in :class:`~fxviz.torchbridge.guard.Backups`)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        state = [*named_state(model, "_parameters", remove_duplicate=False),
                 *named_state(model, "_buffers", remove_duplicate=False)]
        self.owned = {t.untyped_storage().data_ptr(): (k, t) for k, t in state if t.device.type != "meta"}
        self.backups = Backups()
        self.written: list[str] = []  # their names, in the order of their first writes

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        for i, a in enumerate(func._schema.arguments):
            if a.alias_info is None or not a.alias_info.is_write:
                continue
            v = args[i] if i < len(args) else kwargs.get(a.name)
            for t in v if isinstance(v, (list, tuple)) else (v,):
                owner = self.owned.get(t.untyped_storage().data_ptr()) if isinstance(t, torch.Tensor) else None
                if owner is not None and id(owner[1]) not in self.backups.saved:
                    self.written.append(owner[0])
                    self.backups.keep((owner[1],))
        return func(*args, **kwargs)


class _Counts(dict[str, int]):
    """fx's count of the names made from each base (``add`` -> 2 once ``add_2`` is taken, in
    ``Graph._graph_namespace._base_count``), with a journal of its changes: after a rollback the
    counts, and the names of the erased nodes, are given back, so that the nodes made next are
    named as torch.fx names them in a trace that kept the module as one op from the start (fx's
    namespace keeps an erased node's name taken: ``add_3`` where fx has ``add_1``)."""

    def __init__(self, counts: dict[str, int]) -> None:
        super().__init__(counts)
        self.changes: list[tuple[str, int | None]] = []  # (base, count before), oldest first

    def __setitem__(self, base: str, count: int) -> None:
        self.changes.append((base, self.get(base)))
        super().__setitem__(base, count)

    @staticmethod
    def of(graph: torch.fx.Graph) -> _Counts | None:
        """The journaled counts of ``graph``'s namespace, installed on first use; ``None`` where
        torch keeps them otherwise."""
        ns = getattr(graph, "_graph_namespace", None)
        counts = getattr(ns, "_base_count", None)
        if isinstance(counts, _Counts):
            return counts
        if not isinstance(counts, dict) or not hasattr(ns, "_used_names") or not hasattr(ns, "_obj_to_name"):
            return None
        ns._base_count = _Counts(counts)  # type: ignore[union-attr]
        return ns._base_count  # type: ignore[union-attr,no-any-return]

    def give_back(self, graph: torch.fx.Graph, mark: int, erased: list[torch.fx.Node]) -> None:
        """Undo the changes made since ``mark`` (a length of ``changes``), and free the names of
        ``erased``."""
        ns = graph._graph_namespace  # type: ignore[attr-defined]
        for n in erased:
            ns._used_names.discard(n.name)
            ns._obj_to_name.pop(n, None)
        while len(self.changes) > mark:
            base, before = self.changes.pop()
            if before is None:
                super().__delitem__(base)
            else:
                super().__setitem__(base, before)


class _Tracer(torch.fx.Tracer):
    """torch.fx's tracer, which keeps every module of ``torch.nn`` as one ``call_module`` op, made
    to trace through each module that has submodules (``TransformerEncoder``, ``Sequential``): only
    a module without children is a leaf. A module whose forward cannot be traced through (Python
    control flow on a traced value, as in ``MultiheadAttention``'s fast-path checks) is rolled back
    and kept as one op, and ``opaque`` says why: its internals are not in the graph.

    ``called`` lists every module call in the order the calls started, each by its stack (path and
    call index per level, as the nodes' ``nn_module_stack`` numbers them): a call that records no
    op (an ``Identity`` traced through) is still a call of the graph."""

    def __init__(self) -> None:
        super().__init__()
        self.opaque: dict[str, str] = {}  # module path -> why fx kept it as one op
        self.called: list[tuple[ModuleCall, ...]] = []
        self._current: tuple[ModuleCall, ...] = ()
        self._leaves: set[int] = set()  # modules with children that could not be traced through
        self._proxy_cache: dict[str, Any] | None = None
        self._stacks: dict[int, tuple[Any, Any]] = {}  # id of a call's stack -> (it, its nn_module_stack)
        # tensor id -> (first name, tensor): the root's parameters, its buffers (see getattr)
        self._state: tuple[dict[int, tuple[str, Any]], dict[int, tuple[str, Any]]] | None = None

    def create_node(self, *args: Any, **kwargs: Any) -> torch.fx.Node:
        """fx's node, with the module stack shared by the nodes of one call and only the innermost
        user frame as its stack trace: fx copies the whole module stack into every node (item by
        item, in Python) and, with ``record_stack_traces``, formats every user frame of the Python
        stack, which costs the square of the nesting (a model 2,000 modules deep ran out of memory)."""
        stack = self.module_stack
        shared = bool(stack) and not torch.fx.traceback.has_preserved_node_meta()
        if shared:  # torch's create_node copies a non-empty stack into the node, in Python
            self.module_stack = collections.OrderedDict()
        try:
            node = super().create_node(*args, **kwargs)
        finally:
            self.module_stack = stack
        if shared:
            # the copy torch makes, made once per call: found by the call's own stack tuple (which
            # the call keeps alive), checked against fx's stack by its length and innermost key
            hit = self._stacks.get(id(self._current))
            if hit is None or len(hit[1]) != len(stack) or next(reversed(hit[1])) != next(reversed(stack)):
                hit = self._stacks[id(self._current)] = (self._current, type(stack)(stack))
            node.meta["nn_module_stack"] = hit[1]
        frame: types.FrameType | None = sys._getframe(1)
        while frame is not None and not is_user_file(frame.f_code.co_filename):
            # past capture_fx are fxviz's callers (the CLI, click), never a line of the model
            frame = None if frame.f_code is capture_fx.__code__ else frame.f_back
        if frame is not None:
            code = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
            node.stack_trace = f'  File "{frame.f_code.co_filename}", line {frame.f_lineno}, in {frame.f_code.co_name}\n    {code}'
        return node

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if id(m) in self._leaves:
            return True
        return next(iter(m.children()), None) is None and super().is_leaf_module(m, module_qualified_name)

    def trace(self, root: Any, concrete_args: Any = None) -> torch.fx.Graph:
        """fx's trace, with the walks of ``root`` it makes once made without recursion: the paths
        of its modules (``root.named_modules()``, answered once by
        :func:`~fxviz.torchbridge.walk.named_modules`, the same list) and, for :meth:`getattr`,
        the names of its parameters and buffers. torch's walks are chains of generators nested as
        deep as the model, the square of the depth each time."""
        if (not isinstance(root, nn.Module) or "named_modules" in root.__dict__
                or type(root).named_modules is not nn.Module.named_modules):  # a walk of its own: torch's call
            return super().trace(root, concrete_args)
        self._state = None

        def named_modules_once(*args: Any, **kwargs: Any) -> Any:
            del root.__dict__["named_modules"]  # only the call torch makes first, for its paths
            return root.named_modules(*args, **kwargs) if args or kwargs else iter(named_modules(root))

        root.__dict__["named_modules"] = named_modules_once
        try:
            return super().trace(root, concrete_args)
        finally:
            root.__dict__.pop("named_modules", None)

    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict[str, Any]) -> Any:
        """fx's ``getattr``: a parameter (a buffer, with ``proxy_buffer_attributes``) of the root
        read as an attribute becomes a ``get_attr`` op named by its first name in
        ``named_parameters()`` (``named_buffers()``), found in a table made once per trace where
        fx walks every parameter of the model for each read. What the table does not hold (a
        tensor that is not the root's state, or a parameter added during the trace) fx looks up."""
        self._proxy_cache = parameter_proxy_cache  # the trace's own: rolled back with the graph
        if (isinstance(attr_val, torch.Tensor) and (isinstance(attr_val, nn.Parameter) or self.proxy_buffer_attributes)
                and type(self.root).named_parameters is nn.Module.named_parameters
                and type(self.root).named_buffers is nn.Module.named_buffers):
            if self._state is None:
                self._state = ({id(t): (k, t) for k, t in named_state(self.root, "_parameters")},
                               {id(t): (k, t) for k, t in named_state(self.root, "_buffers")})
            hit = self._state[0 if isinstance(attr_val, nn.Parameter) else 1].get(id(attr_val))
            if hit is not None and hit[1] is attr_val:
                name = hit[0]
                if name not in parameter_proxy_cache:
                    kwargs: dict[str, Any] = {}
                    if "proxy_factory_fn" in inspect.signature(self.create_proxy).parameters:
                        kwargs["proxy_factory_fn"] = (None if not self.param_shapes_constant else
                                                      lambda node: torch.fx.proxy.ParameterProxy(self, node, name, attr_val))
                    parameter_proxy_cache[name] = self.create_proxy("get_attr", name, (), {}, **kwargs)
                return parameter_proxy_cache[name]
        return super().getattr(attr, attr_val, parameter_proxy_cache)

    def call_module(self, m: nn.Module, forward: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        path = self.path_of_module(m)
        outer = self._current
        self._current = (*outer, (path, self.num_calls.get(path, 0)))
        self.called.append(self._current)
        try:
            if self.is_leaf_module(m, path) or not any(True for _ in m.children()):
                return super().call_module(m, forward, args, kwargs)
            return self._through(m, path, forward, args, kwargs)
        finally:
            self._current = outer

    def _through(self, m: nn.Module, path: str, forward: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Trace through ``m``; when its forward cannot be traced, erase what it added and keep it
        as one op."""
        last = self.graph._root.prev  # type: ignore[attr-defined]
        # what the try changes, undone by what it added (copies of the module stack and the call
        # counts cost the depth and the number of modules for every call traced through)
        depth, called = len(self.module_stack), len(self.called)
        counts = _Counts.of(self.graph)
        mark = len(counts.changes) if counts is not None else 0
        try:
            return super().call_module(m, forward, args, kwargs)
        except Exception as e:
            if isinstance(e, (torch.fx.proxy.TraceError, NotImplementedError, TypeError, AssertionError,
                              RuntimeError, ValueError, AttributeError)):
                why = first_line(e)
            else:
                raise
        added = []
        n = last.next
        while n is not self.graph._root:  # type: ignore[attr-defined]
            added.append(n)
            n = n.next
        for n in reversed(added):
            self.graph.erase_node(n)
        if counts is not None:
            counts.give_back(self.graph, mark, added)
        gone = set(added)
        if self._proxy_cache is not None:
            for k in [k for k, p in self._proxy_cache.items() if getattr(p, "node", None) in gone]:
                del self._proxy_cache[k]
        while len(self.module_stack) > depth:  # fx pops a call's entry only when it returns
            self.module_stack.popitem()
        for s in self.called[called - 1:]:  # m's own call and each call in it counted itself once
            left = self.num_calls[s[-1][0]] - 1
            if left:
                self.num_calls[s[-1][0]] = left
            else:
                del self.num_calls[s[-1][0]]
        del self.called[called:]
        self._leaves.add(id(m))
        self.opaque[path] = why
        return super().call_module(m, forward, args, kwargs)


@contextlib.contextmanager
def _flat_forward(model: nn.Module, flat: FlatInputs) -> Iterator[None]:
    """The forward fx traces: one placeholder per tensor given, positional or keyword, at any depth
    of a container (``input_i`` for ``flat.tensors[i]``); every other value given (a flag such as
    ``use_cache=False``, a number, ``None``) is a constant of the trace, specialised as
    ``concrete_args`` are, and a parameter not given keeps its default, as the eager call does. fx
    makes a placeholder of each parameter of the root's forward (by rewriting its code object,
    which fails, "co_varnames is too small", on a forward that takes ``*args``, as transformers'
    decorated forwards do); for the length of the trace the model's class is swapped for a
    subclass whose forward takes the tensors and calls the model's own forward with the inputs
    rebuilt. The model is put back however the trace ends."""
    forward = type(model).forward

    def call(self: nn.Module, tensors: tuple[Any, ...]) -> Any:
        args, kwargs = flat.rebuild(tensors)
        return forward(self, *args, **kwargs)

    names = [f"input_{i}" for i in range(len(flat.tensors))]
    ns: dict[str, Any] = {"_call": call}
    exec(f"def forward(self, {', '.join(names)}):\n    return _call(self, ({''.join(n + ', ' for n in names)}))", ns)  # noqa: S102
    cls = type(model)
    model.__class__ = type(cls.__name__, (cls,), {"forward": ns["forward"], "__module__": cls.__module__,
                                                  "__qualname__": cls.__qualname__})
    try:
        yield
    finally:
        model.__class__ = cls


def _specialised(flat: FlatInputs) -> str | None:
    """The note that says which values given are constants of the graph, or ``None``. A value that
    holds tensors pytree cannot reach (a cache object of a type it does not flatten) would be
    baked into the graph as constants: a :class:`TypeError` says what to do."""
    for name, v in flat.constants:
        if holds_tensors(v):
            raise TypeError(f"fx cannot take {name} ({type(v).__name__}) as an input: it holds tensors that pytree "
                            "does not flatten, which fx would bake into the graph as constants; pass its tensors "
                            "as inputs, or use method='export' or 'eager'")
    if not flat.constants:
        return None
    given = ", ".join(f"{k}={reprlib.repr(v)}" for k, v in flat.constants)
    return (f"fx specialised the non-tensor inputs to the values given ({given}), as torch.fx's concrete_args do: "
            "the graph holds for these values only (other values: capture again with them)")


def capture_fx(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], *, validate: bool = True) -> Graph:
    """Capture with ``torch.fx.symbolic_trace``, each tensor given an input and every other value a
    constant (:func:`_flat_forward`, noted); shapes come from fake-tensor propagation. On real
    inputs (and ``validate``) the model runs once on them, and what it raises is a
    :class:`~fxviz.torchbridge.checks.RejectedInputs`: fake tensors check less than real kernels."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    flat = flatten_inputs(model, args, kwargs)
    specialised = _specialised(flat)
    tracer, writes = _Tracer(), _RealWrites(model)
    try:
        with _flat_forward(model, flat), writes:
            graph = tracer.trace(model)
    except torch.fx.proxy.TraceError as e:  # in the root's own forward, which cannot be kept as one op
        e.args = (f"{(str(e).strip().splitlines() or [''])[0]}: fx runs the forward with proxies in place of the input tensors, and this "
                  "line needs a value; use method='export' or 'eager'",)
        raise
    finally:
        writes.backups.restore()
    if writes.written:
        written = ", ".join(writes.written[:3]) + (" …" if len(writes.written) > 3 else "")
        raise torch.fx.proxy.TraceError(
            f"the forward writes {written} in place on tensors fx does not trace (a loop over self.parameters()): "
            "fx would run the write for real and leave it out of the graph; use method='export' or 'eager'")
    root = tracer.root
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]  # input_i: flat.tensors[i]
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fake_args = [mode.from_tensor(t) for t in flat.tensors]
    # on fake copies of the model's state: the graph's in-place writes (a momentum update under
    # no_grad, which fx does not record) would otherwise land in the real parameters; and without
    # grad, as that no_grad ran (shapes do not depend on it)
    state: dict[str, torch.Tensor] = {k: mode.from_tensor(t) for k, t in [*named_state(root, "_parameters", remove_duplicate=False),
                                                 *named_state(root, "_buffers", remove_duplicate=False)]}
    nones: set[torch.fx.Node] = set()
    with _reparametrize_module(root, state), torch.no_grad():
        _prop(root, graph, mode, nones).propagate(*fake_args)

    out_node = next(n for n in reversed(graph.nodes) if n.op == "output")
    returned = _unpack_dataclasses(out_node.args[0])
    out_node.args = (returned,)
    for n in reversed(list(graph.nodes)):
        if not n.users and _is_dataclass_call(n):
            graph.erase_node(n)

    conv = Converter(
        {p.name: Placeholder("input", name, name) for p, name in zip(placeholders, flat.names, strict=True)},
        modules=dict(named_modules(model)),
    )
    conv.convert(graph)
    items: list[tuple[str, torch.fx.Node | None, str | None]] = []
    for path, value in flatten_outputs(returned, leaf_types=(torch.fx.Node,)):
        if isinstance(value, torch.fx.Node) and value in nones:  # what runs returns None there
            items.append((path, None, repr(None)))
        elif isinstance(value, torch.fx.Node):
            items.append((path, value, None))
        else:
            items.append((path, None, repr(value)))
    conv.add_outputs(items)
    mark_tied(conv.nodes, model)
    nodes = with_silent_calls(conv.nodes, tracer.called, conv.modules)
    notes = [specialised] if specialised is not None else []
    for n in nodes:
        why = tracer.opaque.get(n.module) if n.kind == "op" else None
        if why is not None:
            n.attrs["opaque"] = why
            notes.append(opaque_note(n, why, "fx"))
    g = Graph(name=type(model).__name__, nodes=nodes, method="fx", modules=module_infos(model), notes=notes)
    if validate and real_inputs(flat.tensors):
        confirm_forward(model, flat, g)
    return g


class _Traced:
    """What fx's interpreter reads of a module (its graph, its submodules) without building a
    ``GraphModule``, whose generated code names every attribute by its whole path: the square of
    the nesting (48 MB of code and 14 s for a model 2,000 modules deep)."""

    def __init__(self, root: nn.Module, graph: torch.fx.Graph) -> None:
        self.root, self.graph = root, graph

    def named_modules(self) -> list[tuple[str, nn.Module]]:
        return named_modules(self.root)


def _prop(root: nn.Module, graph: torch.fx.Graph, mode: Any, nones: set[torch.fx.Node]) -> Any:
    """Fake-tensor propagation of ``graph`` on ``root`` itself (its attributes and submodules);
    ``nones`` gets the nodes whose value is ``None`` (a field of a module kept as one op that its
    forward left unset, as ``cache`` with ``use_cache=False``)."""
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    class Prop(FakeTensorProp):
        def run_node(self, n: torch.fx.Node) -> Any:
            result = super().run_node(n)
            if result is None:
                nones.add(n)
            return result

        def fetch_attr(self, target: str) -> Any:
            """fx's ``fetch_attr`` (``getattr`` level by level down ``target``: the depth of the
            model per op) as one lookup of the owner in the model's paths."""
            owner, _, name = target.rpartition(".")
            m = paths.get(owner)
            return getattr(m, name) if m is not None and hasattr(m, name) else super().fetch_attr(target)

    paths = dict(named_modules(root, remove_duplicate=False))
    prop = Prop(_Traced(root, graph), mode)  # type: ignore[arg-type]
    prop.module = root
    return prop


def _unpack_dataclasses(v: Any) -> Any:
    """fx records a returned dataclass as a call of its class with the fields as kwargs; turn it back
    into a mapping of fields so outputs get their paths (``logits``, ``hidden``) and shapes."""
    if isinstance(v, (tuple, list)):
        return type(v)(_unpack_dataclasses(x) for x in v)
    if isinstance(v, dict):
        return {k: _unpack_dataclasses(x) for k, x in v.items()}
    if isinstance(v, torch.fx.Node) and _is_dataclass_call(v):
        return {k: _unpack_dataclasses(x) for k, x in v.kwargs.items()}
    return v


def _is_dataclass_call(n: torch.fx.Node) -> bool:
    return (
        n.op == "call_function" and isinstance(n.target, type) and dataclasses.is_dataclass(n.target)
        and not n.args
    )


__all__ = ["capture_fx"]
