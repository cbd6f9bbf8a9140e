"""The eager runtime tracer: run the model once and record what it executes, as the same IR the
symbolic methods produce.

Three observers work together while the real forward runs:

* a ``TorchFunctionMode`` (``level="function"``) sees each call a user writes (``F.linear``,
  ``Tensor.view``, ``Tensor.__setitem__``); torch hides the mode while it handles a call, so only
  outermost calls are seen and nothing nests. A ``TorchDispatchMode`` (``level="aten"``) sees ATen
  ops instead, the level export's graphs are at;
* forward pre/post hooks on every submodule keep an ordered module stack of our own, with a call
  index per module path (``h.0``'s second call is ``("h.0", 1)``, export's ``@1``);
* a weak identity map from tensor to the node output that produced it, with the tensor's version
  counter: an in-place op bumps the version, so a reader of a mutated tensor points at the node that
  wrote it, also when the write went through a view (views share their base's version counter).

Torch objects stop here, as in ``torchbridge``: tensors become :class:`TensorMeta`, frames
become :class:`SourceLoc`, arguments become JSON-safe attrs (see :mod:`fxviz.fallback.values`).
"""

from __future__ import annotations

import contextlib
import linecache
import sys
import types
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.overrides import TorchFunctionMode, resolve_name
from torch.utils._python_dispatch import TorchDispatchMode

from fxviz.errors import ModelError, TargetError
from fxviz.fallback.values import encode, has_opaque
from fxviz.ir import Graph, ModuleCall, Node, NodeKind, Ref, SourceLoc, TensorMeta
from fxviz.torchbridge.normalize import _describe, flatten_inputs, flatten_outputs
from fxviz.torchbridge.run import gc_paused
from fxviz.torchbridge.source import error_location, is_user_file
from fxviz.torchbridge.values import meta_from_value, module_infos, output_node

Level = str  # "function" | "aten"

# Metadata queries return facts about a tensor, not values computed from its data: not ops.
_META_ATTRS = frozenset(
    ["shape", "dtype", "device", "ndim", "layout", "requires_grad", "is_leaf", "grad_fn", "is_cuda", "is_cpu", "is_meta", "is_sparse", "is_quantized", "is_mkldnn", "is_nested", "names", "itemsize", "nbytes", "_version", "_base", "output_nr", "is_mps", "is_xpu", "is_ipu", "is_xla", "is_vulkan", "_cdata"]
)
_META_METHODS = frozenset(
    ["size", "dim", "stride", "numel", "nelement", "ndimension", "is_contiguous", "data_ptr", "element_size", "storage_offset", "is_floating_point", "is_complex", "is_signed", "get_device", "__len__", "__repr__", "__format__", "__hash__", "untyped_storage", "dim_order", "is_inference", "is_set_to", "__reduce_ex__", "__deepcopy__", "__dir__", "__array_priority__", "has_names", "is_pinned", "is_shared", "__contains__"]
)
# Where the forward leaves the graph: a Python value computed from tensor data.
_DATA_DEPENDENT = frozenset(
    ["item", "__bool__", "__int__", "__float__", "__index__", "__complex__", "tolist", "numpy", "__array__", "equal", "allclose", "is_nonzero", "_local_scalar_dense"]
)
# Ops whose result depends on the random number generator: a replay cannot reproduce them.
_RANDOM = frozenset(
    ["rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm", "bernoulli", "bernoulli_", "multinomial", "normal", "normal_", "uniform_", "exponential_", "geometric_", "cauchy_", "log_normal_", "random_", "rrelu", "rrelu_", "native_dropout"]
)
_DROPOUTS = frozenset(["dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"])

_SKIP, _OP, _EXIT = 0, 1, 2
#: level -> callable -> (what to do, target, node name); naming a callable (resolve_name) is slow
#: and its answer never changes, so it is shared by every capture in the process
_KINDS: dict[str, dict[Any, tuple[int, str, str]]] = {"function": {}, "aten": {}}
_PLAIN_TYPES = frozenset({int, bool, str})


class _TracerFault(Exception):
    """Raised when the tracer's own bookkeeping fails, so it is never mistaken for the model's
    error; :func:`trace_eager` turns it back into the original exception."""


class TensorMap:
    """Tensor -> value by identity, without keeping tensors alive (``WeakIdKeyDictionary`` with
    less per-lookup work: this is on every op's path). A dead tensor's entry is never returned: its
    weak reference no longer resolves to the tensor that now has the same ``id``."""

    __slots__ = ("_d",)

    def __init__(self) -> None:
        self._d: dict[int, tuple[weakref.ref[torch.Tensor], Any]] = {}

    def get(self, t: torch.Tensor) -> Any:
        e = self._d.get(id(t))
        return e[1] if e is not None and e[0]() is t else None

    def __setitem__(self, t: torch.Tensor, value: Any) -> None:
        self._d[id(t)] = (weakref.ref(t), value)


_METAS: dict[tuple[Any, ...], TensorMeta] = {}


def _meta(v: Any) -> TensorMeta:
    """TensorMeta of a tensor or Python value seen at runtime (all sizes are concrete). Tensor
    metas are immutable and shared: a model repeats a handful of shapes thousands of times."""
    if isinstance(v, torch.Tensor):
        key = (v.shape, v.dtype, v.device)  # torch.Size hashes as a tuple: no conversion per op
        m = _METAS.get(key)
        if m is None:
            m = _METAS[key] = TensorMeta(
                tuple(v.shape), str(v.dtype).removeprefix("torch."), v.device.type
            )
        return m
    m = meta_from_value(v)  # Python and symbolic scalars, as every capture method shows them
    if m is not None:
        return m
    if v is None:
        return TensorMeta((), "none")
    return TensorMeta((), "object", value=_describe(v))


def _version(t: torch.Tensor) -> int:
    try:
        return t._version
    except RuntimeError:  # inference-mode tensors have no version counter and cannot be mutated
        return 0


class Recorder:
    """The trace being built: nodes, the module stack, and tensor -> producer bookkeeping."""

    def __init__(
        self, model: nn.Module, level: Level, *, snapshot_buffers: bool,
        named: list[tuple[str, nn.Module]] | None = None,
    ) -> None:
        self.level = level
        self.nodes: list[Node] = []
        self.stack: tuple[ModuleCall, ...] = ()
        self._frames: list[tuple[str, tuple[ModuleCall, ...]]] = []
        self._calls: dict[str, int] = {}
        self._names: dict[str, int] = {}
        self._taken: set[str] = set()
        # tensor -> [producer ref, version when it was produced]
        self.values = TensorMap()
        # base tensor -> (node that last wrote its storage, version after the write)
        self.writes = TensorMap()
        # one walk of the module tree serves the recorder, the hooks and module_infos (a deep
        # model's walk costs as much as hundreds of its ops); a shared module keeps its first path
        named = named if named is not None else list(model.named_modules(remove_duplicate=False))
        first: dict[int, tuple[str, nn.Module]] = {}
        for path, m in named:
            first.setdefault(id(m), (path, m))
        self.modules = list(first.values())
        # the model's state by identity -> (kind, state-dict name); one walk, first name wins as
        # in named_parameters(); the model keeps every key alive for the whole capture
        self.state = TensorMap()
        for path, m in self.modules:
            prefix = f"{path}." if path else ""
            for kind, members in (("parameter", m._parameters), ("buffer", m._buffers)):
                for name, t in members.items():
                    if t is not None and self.state.get(t) is None:
                        self.state[t] = (kind, prefix + name)
        self._attributes_scanned = False
        self.snapshot_buffers = snapshot_buffers
        self.saved: list[tuple[torch.Tensor, torch.Tensor, int]] = []  # buffer, copy, version
        self._kinds = _KINDS[level]
        self._user_code: dict[types.CodeType, bool] = {}
        self._locs: dict[tuple[types.CodeType, int], SourceLoc] = {}
        self._mutable_args: dict[Any, tuple[int, ...]] = {}
        self._pending: list[tuple[torch.Tensor, Node, int]] = []
        self.failed: Node | None = None
        self.failed_stack: tuple[ModuleCall, ...] = ()
        self.replay_blockers: list[str] = []
        # ATen level: the torch-function call running now, and a counter per call name
        self.call: list[str] | None = None
        self._call_ids: dict[str, int] = {}

    # ---- names, sources, module stack ----------------------------------------------------------

    def unique(self, base: str) -> str:
        n = self._names.get(base, 0)
        name = base if n == 0 else f"{base}_{n}"
        while name in self._taken:
            n += 1
            name = f"{base}_{n}"
        self._names[base] = n + 1
        self._taken.add(name)
        return name

    def source(self) -> SourceLoc | None:
        """The innermost user frame calling the current op; decisions and locations are cached per
        code object and line, so a model's hot loop costs a few dict lookups per op."""
        f: types.FrameType | None = sys._getframe(2)
        user = self._user_code
        while f is not None:
            code = f.f_code
            u = user.get(code)
            if u is None:
                u = user[code] = is_user_file(code.co_filename)
            if u:
                key = (code, f.f_lineno)
                loc = self._locs.get(key)
                if loc is None:
                    line = linecache.getline(code.co_filename, f.f_lineno).strip()
                    loc = self._locs[key] = SourceLoc(code.co_filename, f.f_lineno, code.co_name, line)
                return loc
            f = f.f_back
        return None

    def enter(self, path: str) -> None:
        n = self._calls.get(path, 0)
        self._calls[path] = n + 1
        self._frames.append((path, self.stack))
        self.stack = (*self.stack, (path, n))

    def leave(self, path: str) -> None:
        # pop through frames a forward that raised (and was caught by the model) left behind
        frames = self._frames
        while frames:
            p, outer = frames.pop()
            if p == path:
                self.stack = outer
                return

    # ---- tensor identity -----------------------------------------------------------------------

    def read(self, t: torch.Tensor) -> Ref:
        """The node output a tensor argument comes from, creating parameter/buffer/constant nodes
        on first read."""
        return self.read_versioned(t, _version(t))

    def read_versioned(self, t: torch.Tensor, v: int) -> Ref:
        e = self.values.get(t)
        if e is None:
            return self._source_node(t)
        if v != e[1]:
            if self._pending:
                self._finish_pending()
                v = _version(t)
            return self._stale(t, e, v)
        return e[0]  # type: ignore[no-any-return]

    def _stale(self, t: torch.Tensor, e: list[Any], v: int) -> Ref:
        """``t`` changed since it was produced: if a recorded op wrote its storage last (directly or
        through a view), ``t`` now comes from that op, as an extra output of it."""
        base = t._base if t._base is not None else t
        w = self.writes.get(base)
        if w is not None and w[1] == v and w[0].name != e[0].node:
            ref = self._alias_output(w[0], t, e[0])
        else:
            ref = e[0]
        e[0], e[1] = ref, v
        return ref

    def _alias_output(self, node: Node, t: torch.Tensor, previous: Ref) -> Ref:
        """Give ``node`` one more output: tensor ``t`` (formerly ``previous``) as the node left it."""
        k = len(node.outputs)
        node.outputs = (*node.outputs, _meta(t))
        node.attrs.setdefault("aliases", []).append([k, previous.to_json()])
        return Ref(node.name, k)

    def _scan_attributes(self) -> None:
        """Plain tensor attributes of modules (not registered buffers) are constants with a name;
        looked for only once a tensor of unknown origin shows up, which most models never do."""
        self._attributes_scanned = True
        for path, m in self.modules:
            for attr, v in vars(m).items():
                if isinstance(v, torch.Tensor) and self.state.get(v) is None:
                    self.state[v] = ("constant", f"{path}.{attr}" if path else attr)

    def _source_node(self, t: torch.Tensor) -> Ref:
        kind: NodeKind
        known = self.state.get(t)
        if known is None and not self._attributes_scanned:
            self._scan_attributes()
            known = self.state.get(t)
        kind, name = known or ("constant", "")
        if kind == "buffer" and self.snapshot_buffers:
            with torch.no_grad():
                self.saved.append((t, t.detach().clone(), _version(t)))
        if not name:
            self.replay_blockers.append("reads a tensor the model does not own (a global or a closure)")
        owner = name.rpartition(".")[0]
        node = Node(
            self.unique(name or "constant"), kind, target=name,
            stack=((owner, 0),) if owner else (), outputs=(_meta(t),),
        )
        self.nodes.append(node)
        ref = Ref(node.name)
        self.values[t] = [ref, _version(t)]
        return ref

    def add_input(self, name: str, t: torch.Tensor) -> None:
        node = Node(self.unique(name), "input", target=name, outputs=(_meta(t),))
        self.nodes.append(node)
        self.values[t] = [Ref(node.name), _version(t)]

    # ---- recording one call --------------------------------------------------------------------

    def kind_of(self, func: Any) -> tuple[int, str, str]:
        """(what to do, target, node name) for a callable, resolved once per callable."""
        k = self._kinds.get(func)
        if k is None:
            k = self._kinds[func] = self._classify(func)
        return k

    def _classify(self, func: Any) -> tuple[int, str, str]:
        return _classify(func, self.level)

    def call_of(self, func: Any) -> list[str] | None:
        """ATen level: ``[call id, name]`` of the torch-function call about to run, the key its
        ATen ops are grouped by (as export's ``torch_fn``); ``None`` for a metadata query."""
        kinds = _KINDS["function"]
        k = kinds.get(func)
        if k is None:
            k = kinds[func] = _classify(func, "function")
        if k[0] == _SKIP:
            return None
        n = self._call_ids.get(k[2], 0) + 1
        self._call_ids[k[2]] = n
        return [f"{k[2]}_{n}", k[1]]

    def collect(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], names: list[str] | None
    ) -> tuple[list[Ref], dict[str, Any], list[tuple[torch.Tensor, int]]]:
        """Inputs in argument order, JSON-safe attrs, and the tensor arguments with their
        versions (to see afterwards which ones the call wrote). The hot path of the tracer."""
        inputs: list[Ref] = []
        attrs: dict[str, Any] = {}
        seen: list[tuple[torch.Tensor, int]] = []
        exact: dict[str, Any] | None = None
        values = self.values._d

        def read(t: torch.Tensor) -> Ref:
            v = _version(t)
            r = self.read_versioned(t, v)
            inputs.append(r)
            seen.append((t, v))
            return r

        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                # inlined read(): the common case is a tensor produced by the previous op
                try:
                    v = a._version
                except RuntimeError:  # an inference tensor
                    v = 0
                e = values.get(id(a))
                if e is not None and e[0]() is a and e[1][1] == v:
                    inputs.append(e[1][0])
                else:
                    inputs.append(self.read_versioned(a, v))
                seen.append((a, v))
                continue
            key = names[i] if names is not None and i < len(names) else f"arg{i}"
            if a is None or type(a) in _PLAIN_TYPES:
                attrs[key] = a
                continue
            display, ex = encode(a, read)
            attrs[key] = display
            if ex is not None:
                exact = exact or {}
                exact[key] = ex
        for key, a in kwargs.items():
            if a is None or type(a) in _PLAIN_TYPES:
                attrs[key] = a
                continue
            display, ex = encode(a, read)
            attrs[key] = display
            if ex is not None:
                exact = exact or {}
                exact[key] = ex
        if exact is not None:
            attrs["py"] = exact
            if has_opaque(exact):
                self.replay_blockers.append("passes a value replay cannot rebuild (a callable?)")
        return inputs, attrs, seen

    def observe(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], *, aten: bool) -> Any:
        """Run one call and record it: the body of both recording modes.

        A failure of our own bookkeeping is a :class:`_TracerFault`, never mistaken for the model's
        error; an exception from the call itself marks the node and propagates unchanged."""
        try:
            if aten and self._pending:
                self._finish_pending()
            kind = self.kind_of(func)
            skip = kind[0] == _SKIP
            if not skip:
                names = [a.name for a in func._schema.arguments] if aten else None
                inputs, attrs, seen = self.collect(args, kwargs, names)
                source = self.source()
                mutated: tuple[int, ...] = ()
                if aten and names is not None:
                    writes = self.mutable_args(func)
                    if writes:
                        # the schema counts all arguments; map its positions onto the tensors seen
                        positions = _tensor_positions(args, kwargs, names)
                        mutated = tuple(positions[i] for i in writes if i in positions)
        except Exception as e:
            raise _TracerFault(f"tracer failed before {func}") from e
        if skip:
            return func(*args, **kwargs)
        try:
            out = func(*args, **kwargs)
        except Exception as e:
            self.record_failure(kind, inputs, attrs, source, e)
            raise
        try:
            self.record(kind, inputs, attrs, seen, out, source, mutated)
        except Exception as e:
            raise _TracerFault(f"tracer failed after {func}") from e
        return out

    def record(
        self,
        kind: tuple[int, str, str],
        inputs: list[Ref],
        attrs: dict[str, Any],
        seen: list[tuple[torch.Tensor, int]],
        out: Any,
        source: SourceLoc | None,
        mutated: tuple[int, ...] = (),
    ) -> Node | None:
        """Add the node for one finished call, unless it computed nothing a graph shows."""
        what, target, short = kind
        if isinstance(out, torch.Tensor):
            outs: tuple[Any, ...] = (out,)
            has_tensor = True
        else:
            if isinstance(out, (tuple, list)) and what != _EXIT:
                outs = tuple(out)
            else:
                outs = (out,) if out is not None else ()
            has_tensor = any(isinstance(o, torch.Tensor) for o in outs)
        if self.level == "aten":
            written = [seen[i][0] for i in mutated if i < len(seen)]
        else:
            written = [t for t, v in seen if _version(t) != v] if seen else []
        if not (has_tensor or written or what == _EXIT):
            return None
        node = Node(
            self.unique(short), "op", target, tuple(inputs), self.stack,
            tuple([_meta(o) for o in outs]), source, attrs,
        )
        if what == _EXIT:
            attrs["data_dependent"] = True
        if self.call is not None:
            attrs["torch_fn"] = self.call
        elif not written and seen and outs and outs[0] is seen[0][0]:
            # a call that hands back its input (``contiguous()`` on a contiguous tensor, eval-mode
            # dropout): export records nothing for it, and a comparison needs to know why
            attrs["returns_input"] = True
        elif short in _RANDOM or (short in _DROPOUTS and _dropout_active(attrs)):
            self.replay_blockers.append(f"{target} draws random numbers")
        self.nodes.append(node)
        values = self.values
        name = node.name
        for i, o in enumerate(outs):
            if isinstance(o, torch.Tensor):
                values[o] = [Ref(name, i), _version(o)]
        if written:
            self._written(node, outs, written)
        return node

    def _written(self, node: Node, outs: tuple[Any, ...], written: list[torch.Tensor]) -> None:
        """The op wrote these tensor arguments in place: each is now a value this node produced
        (an extra output when the op does not return it), and the writer of its storage."""
        for t in written:
            k = next((i for i, o in enumerate(outs) if o is t), None)
            if k is None:
                prev = self.values.get(t)
                k = len(node.outputs)
                node.outputs = (*node.outputs, _meta(t))
                if prev is not None:
                    node.attrs.setdefault("aliases", []).append([k, prev[0].to_json()])
                self.values[t] = [Ref(node.name, k), _version(t)]
            if self.level == "aten":  # the version moves only after this op returns
                self._pending.append((t, node, k))
            else:
                self.writes[t._base if t._base is not None else t] = (node, _version(t))

    def _finish_pending(self) -> None:
        """ATen level: the autograd layer bumps a written tensor's version after the dispatch mode
        returns, so the write is bound to its version at the next op."""
        for t, node, k in self._pending:
            v = _version(t)
            self.values[t] = [Ref(node.name, k), v]
            self.writes[t._base if t._base is not None else t] = (node, v)
        self._pending.clear()

    def record_failure(
        self, kind: tuple[int, str, str], inputs: list[Ref], attrs: dict[str, Any],
        source: SourceLoc | None, exc: BaseException,
    ) -> None:
        _, target, short = kind
        if self.call is not None:
            attrs["torch_fn"] = self.call
        node = Node(
            self.unique(short), "op", target=target, inputs=tuple(inputs), stack=self.stack,
            source=source, attrs=attrs, error=f"{type(exc).__name__}: {exc}",
        )
        self.nodes.append(node)
        self.failed = node

    def mutable_args(self, func: Any) -> tuple[int, ...]:
        """ATen level: positions of the arguments an op writes, from its schema."""
        m = self._mutable_args.get(func)
        if m is None:
            schema = getattr(func, "_schema", None)
            m = tuple(
                i for i, a in enumerate(schema.arguments if schema is not None else ())
                if a.alias_info is not None and a.alias_info.is_write
            )
            self._mutable_args[func] = m
        return m


def _classify(func: Any, level: Level) -> tuple[int, str, str]:
    """(what to do, target, node name) of a callable at ``level``."""
    if level == "aten":
        target = str(func)
        short = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else target
        return (_EXIT if short in _DATA_DEPENDENT else _OP), target, short
    name = _function_name(func)
    parts = name.split(".")
    if parts[-1] == "__get__":
        short = parts[-2]
        if name.startswith("Tensor.") and short in _META_ATTRS:
            return _SKIP, name, short
    else:
        short = parts[-1]
        if name.startswith("Tensor.") and short in _META_METHODS:
            return _SKIP, name, short
    what = _EXIT if short in _DATA_DEPENDENT else _OP
    return what, name, short.strip("_") or short


def _dropout_active(attrs: dict[str, Any]) -> bool:
    training = attrs.get("training", attrs.get("arg2", attrs.get("train", True)))
    p = attrs.get("p", attrs.get("arg1", 0.5))
    return bool(training) and p != 0


def _function_name(func: Any) -> str:
    """``torch.nn.functional.linear``, ``Tensor.view``, ``Tensor.T.__get__``: how a user writes it."""
    try:
        name = resolve_name(func)
    except Exception:  # resolve_name walks torch's namespaces; anything odd falls through
        name = None
    if not name:
        mod = getattr(func, "__module__", None) or ""
        qual = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)
        name = f"{mod}.{qual}" if mod and mod != "builtins" else str(qual)
    if name.startswith("torch._VariableFunctionsClass."):  # how resolve_name spells some torch.* ops
        name = "torch." + name.removeprefix("torch._VariableFunctionsClass.")
    return name.removeprefix("torch.") if name.startswith("torch.Tensor.") else name


class _FunctionMode(TorchFunctionMode):
    """Records every outermost torch-function call (torch hides this mode while a call runs)."""

    def __init__(self, rec: Recorder) -> None:
        super().__init__()
        self.rec = rec

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        return self.rec.observe(func, args, kwargs or {}, aten=False)


class _CallMode(TorchFunctionMode):
    """ATen level: keeps ``Recorder.call`` on the torch-function call each ATen op runs inside, so
    a comparison can fold a call's ATen ops back to it. Torch hides the mode while a call runs, so
    calls never nest; metadata queries cost one dict lookup."""

    def __init__(self, rec: Recorder) -> None:
        super().__init__()
        self.rec = rec

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        rec = self.rec
        try:
            call = rec.call_of(func)
        except Exception as e:
            raise _TracerFault(f"tracer failed before {func!r}") from e
        if call is None:
            return func(*args, **(kwargs or {}))
        outer, rec.call = rec.call, call
        try:
            return func(*args, **(kwargs or {}))
        finally:
            rec.call = outer


class _DispatchMode(TorchDispatchMode):
    """Records every ATen op that reaches the Python dispatch key."""

    def __init__(self, rec: Recorder) -> None:
        super().__init__()
        self.rec = rec

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        return self.rec.observe(func, args, kwargs or {}, aten=True)


def _tensor_positions(args: tuple[Any, ...], kwargs: dict[str, Any], names: list[str]) -> dict[int, int]:
    """Schema argument index -> index among the tensors :meth:`Recorder.collect` read."""
    out: dict[int, int] = {}
    n = 0
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            out[i] = n
            n += 1
        elif isinstance(a, (list, tuple)):
            n += sum(isinstance(x, torch.Tensor) for x in a)
    index = {name: i for i, name in enumerate(names)}
    for k, a in kwargs.items():
        if isinstance(a, torch.Tensor):
            if k in index:
                out[index[k]] = n
            n += 1
        elif isinstance(a, (list, tuple)):
            n += sum(isinstance(x, torch.Tensor) for x in a)
    return out


@contextlib.contextmanager
def _module_hooks(model: nn.Module, rec: Recorder) -> Iterator[None]:
    """Keep ``rec``'s module stack in step with the model's module calls; removed however the
    block exits.

    Two global hooks serve every submodule (registering two hooks per module costs more than the
    ops of a deep model). Global pre-hooks run before a module's own, so the ops of a user's
    pre-hook belong to the module; global forward hooks run before a module's own too, so a
    module with forward hooks of its own gets its exit hook appended after them instead.
    """
    paths = {id(m): (m, path) for path, m in rec.modules if path}
    own_exit: dict[int, str] = {}
    handles = []

    def pre(module: nn.Module, args: Any) -> None:
        e = paths.get(id(module))
        if e is not None and e[0] is module:
            rec.enter(e[1])

    def post(module: nn.Module, args: Any, output: Any) -> None:
        e = paths.get(id(module))
        if e is not None and e[0] is module and id(module) not in own_exit:
            rec.leave(e[1])

    try:
        for key, (m, path) in paths.items():
            if m._forward_hooks:
                own_exit[key] = path
                handles.append(m.register_forward_hook(lambda mod, a, o, p=path: rec.leave(p)))
        handles.append(register_module_forward_pre_hook(pre))
        handles.append(register_module_forward_hook(post))
        yield
    finally:
        for h in handles:
            h.remove()


def uses_meta(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """True when the model's state or an input lives on ``meta``: real execution is impossible,
    fake tensors are needed."""
    if any(t.is_meta for t in model.parameters()) or any(t.is_meta for t in model.buffers()):
        return True
    return any(t.is_meta for t in flatten_inputs(model, args, kwargs).tensors)


def trace_eager(
    model: nn.Module,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    level: Level = "function",
    fake: bool = False,
    grad: bool = False,
) -> Graph:
    """Run ``model(*args, **kwargs)`` once and return the graph of what it executed.

    ``level="function"`` records torch-function calls (``torch.nn.functional.linear``,
    ``Tensor.view``), ``level="aten"`` ATen ops (``aten.addmm.default``). ``fake=True`` runs under
    ``FakeTensorMode``: no real memory or compute, so a model built on ``meta`` traces too. The
    forward runs under ``torch.no_grad()`` unless ``grad=True`` (for a forward that itself takes
    gradients): recording needs no autograd graph, and building one costs time and memory.

    The model and torch are left as found. If the model raises, :class:`~fxviz.errors.ModelError`
    carries the graph up to the failure (``err.graph``, failing op marked) and chains the original.

        >>> g = trace_eager(model, (x,))
        >>> g.method, g.ops[0].target
        ('eager', 'torch.nn.functional.linear')
    """
    if level not in ("function", "aten"):
        raise TargetError(f"level {level!r} is not one of 'function', 'aten'")
    kwargs = dict(kwargs or {})
    named = list(model.named_modules(remove_duplicate=False))
    rec = Recorder(model, level, snapshot_buffers=not fake, named=named)
    flat = flatten_inputs(model, args, kwargs)
    fake_mode: Any = contextlib.nullcontext()
    if fake:
        from torch._subclasses.fake_tensor import FakeTensorMode

        fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
        on_meta = any(t.is_meta for t in model.parameters())
        tensors = tuple(
            fake_mode.from_tensor(t.to("meta") if on_meta else t) for t in flat.tensors
        )
        args, kwargs = flat.rebuild(tensors)
    else:
        tensors = flat.tensors
    for name, t in zip(flat.names, tensors, strict=True):
        rec.add_input(name, t)

    method = ("eager" if level == "function" else "eager-aten") + (" (fake)" if fake else "")
    graph = Graph(name=type(model).__name__, method=method, modules=module_infos(model, named))
    recorder_mode: Any = _FunctionMode(rec) if level == "function" else _DispatchMode(rec)
    call_mode: Any = _CallMode(rec) if level == "aten" else contextlib.nullcontext()
    grad_mode: Any = contextlib.nullcontext() if grad else torch.no_grad()
    try:
        with fake_mode, _module_hooks(model, rec), gc_paused():
            try:
                # a capture observes the forward, it does not train: no autograd graph to build
                # (time and memory the plain forward under no_grad does not spend either)
                with grad_mode, call_mode, recorder_mode:
                    out = model(*args, **kwargs)
            except Exception:
                rec.failed_stack = rec.stack
                raise
            rec._finish_pending()
            _add_outputs(rec, out)
    except _TracerFault as e:
        raise (e.__cause__ or e) from None  # a tracer bug: the capture fails, not the model
    except Exception as e:
        if _beyond_the_tracer(e):
            raise

        graph.nodes = rec.nodes
        raise _model_error(graph, rec, e) from e
    finally:
        _restore_buffers(rec)
    graph.nodes = rec.nodes
    graph.annotations["replay"] = _replay_verdict(rec)
    return graph


def _beyond_the_tracer(exc: BaseException) -> bool:
    """True when the forward failed because it compiles part of itself (``torch.cond`` runs its
    branches through ``torch.compile`` in eager mode) and the compiler cannot trace through a
    recording mode: a limit of this capture method, not an error of the model."""
    return type(exc).__module__.startswith("torch._dynamo") or "HigherOrderOperator" in str(exc)


def _add_outputs(rec: Recorder, out: Any) -> None:
    for path, v in flatten_outputs(out):
        if isinstance(v, torch.Tensor):
            rec.nodes.append(output_node(rec.unique(path), path, rec.read(v), None))
        else:
            rec.nodes.append(output_node(rec.unique(path), path, None, _describe(v)))


def _replay_verdict(rec: Recorder) -> dict[str, Any]:
    if rec.level != "function":
        return {"ok": False, "reason": "replay runs function-level graphs (method 'eager')"}
    if rec.replay_blockers:
        return {"ok": False, "reason": "; ".join(dict.fromkeys(rec.replay_blockers))}
    return {"ok": True}


def _restore_buffers(rec: Recorder) -> None:
    """Put back buffers the forward may have written (BatchNorm running statistics): a capture must
    leave the model as it found it. Only buffers the forward read were copied, when first read; all
    of them are copied back, since BatchNorm's kernel updates its statistics without bumping their
    version counter."""
    with torch.no_grad():
        for buf, saved, _ in rec.saved:
            buf.copy_(saved)
    rec.saved.clear()


def _model_error(graph: Graph, rec: Recorder, exc: Exception) -> ModelError:
    failed = rec.failed
    stack = failed.stack if failed is not None else rec.failed_stack
    path, call = stack[-1] if stack else ("", 0)
    cls = graph.modules[path].cls if path in graph.modules else graph.name
    loc = error_location(exc) or (failed.source if failed is not None else None)
    where = f"module '{path}' ({cls})" if path else f"the root module ({cls})"
    if call:
        where += f" call {call}"
    at = f" at {loc} `{loc.code}`" if loc is not None else ""
    message = f"{type(exc).__name__}: {exc} in {where}{at}"
    graph.error = message
    graph.annotations["failure"] = {
        "module": path, "call": call, "node": failed.name if failed is not None else None,
        "source": loc.to_dict() if loc is not None else None,
    }
    graph.annotations["replay"] = {"ok": False, "reason": "the graph is partial: the model raised"}
    return ModelError(f"the model raised during eager capture: {message}", graph=graph)


__all__ = ["Recorder", "trace_eager", "uses_meta"]
