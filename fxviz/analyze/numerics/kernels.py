"""Numerics inside Inductor (``--against compile:inductor --per-kernel``): every kernel's output
buffers against the eager values of the ops it replaces, in execution order.

What is read, all of it torch's own record of the run:

- while the model compiles, torch's structured trace (:func:`~fxviz.torchbridge.tracelog.structured_trace`,
  provenance tracking on), read by :func:`fxviz.tracefile.read_events`: per compiled graph the output
  code (its path, the kernel calls in the order ``call()`` runs them with their provenance handles,
  the C++ kernels' argument types), ``inductor_provenance_tracking_node_mappings`` (``cppCodeToPost``:
  handle -> post-grad nodes, ``postToPre``/``preToPost``: post-grad <-> Dynamo nodes) and the kernel
  stack traces;
- which post-grad node each buffer holds: Inductor's own ``origin_node`` of each buffer, read where
  Inductor records the kernel's provenance (``torch._inductor.debug.set_kernel_post_grad_provenance_tracing``,
  wrapped for the compile: it is handed the kernel's scheduler nodes). Inductor's FX graph cache and
  AOT Autograd's cache are off for the compile, so that code generation (and so that record) runs.

Then the compiled model runs once more (:class:`KernelWatch` is the observer of
:class:`~fxviz.analyze.numerics.boundary.CompiledSide`). For each call of a compiled graph, its Dynamo
graph first runs in a :class:`torch.fx.Interpreter` on the same inputs (inputs other than parameters
are copied: an in-place op must not change what the compiled call gets), keeping the values of the
Dynamo nodes a buffer may stand for; then the compiled call runs with the loaded output-code module's
kernels (``cpp_fused_*``, ``triton_*``, ``extern_kernels``) wrapped, so that right after each kernel
the buffers it wrote (non-const pointers of a C++ kernel, ``out_ptr``/``in_out_ptr`` arguments of a
Triton kernel, an extern kernel's ``out=`` or result) are compared with eager. A buffer is compared
with the value of the Dynamo node its post-grad node maps to (``postToPre``) when that node is the
Dynamo node's value (the last of its post-grad nodes with as many elements): eager computes no other
value. A buffer holding a partial result inside a fusion (a layer norm's mean) is named as not
comparable. Same tolerance as the rest of the compile side (:func:`~fxviz.analyze.numerics.metrics.compare`).

Each kernel also runs a second time, on copies of its arguments that hold eager's values of what it
reads (:mod:`~fxviz.analyze.numerics.isolate`): its own error, apart from what the compiled run
handed it. Note that each graph's eager values are computed from the inputs the compiled call got:
nothing is inherited across a graph break.
"""

from __future__ import annotations

import contextlib
import operator
import re
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.fx
from torch import nn

from fxviz.analyze.compilemap.record import OpRecord, module_paths, op_nodes, op_records
from fxviz.analyze.numerics.boundary import CompiledSide
from fxviz.analyze.numerics.error import Error
from fxviz.analyze.numerics.isolate import Isolated, Shadows, eager_values, isolate, placed
from fxviz.analyze.numerics.kernelcode import (
    CallSite,
    Dotted,
    Rerun,
    Written,
    call_site,
    cpp_written,
    kind_of,
    loaded_module,
    wrap_kernel,
)
from fxviz.analyze.numerics.kernelresult import BufferCheck, KernelCheck
from fxviz.analyze.numerics.metrics import compare
from fxviz.torchbridge.tracelog import Event, structured_trace
from fxviz.tracefile import read_events
from fxviz.tracefile.code import parse_output_code

_PARTIAL = ("Inductor records no post-grad node whose value it holds (a partial result inside the kernel, "
            "or a copy in another layout): eager computes no such value")
#: Post-grad ops that only reshape their input: the node before one carries the same value.
_RESHAPES = {"aten.view", "aten._unsafe_view", "aten.reshape", "aten.squeeze", "aten.unsqueeze", "aten.alias"}
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


@dataclass
class _Graph:
    """What one compiled Dynamo graph's compile recorded, and its watched call's values."""

    gm: torch.fx.GraphModule
    records: list[OpRecord]
    start: int = 0
    stop: int = 0
    buffers: dict[str, dict[str, str | None]] = field(default_factory=dict)  # handle -> buffer -> post-grad node
    order: dict[str, int] = field(default_factory=dict)  # post-grad node -> position
    numel: dict[str, int | None] = field(default_factory=dict)
    random: set[str] = field(default_factory=set)  # post-grad nodes that draw random numbers
    views: set[str] = field(default_factory=set)  # post-grad nodes that only reshape: same value
    items: dict[tuple[str, int], str] = field(default_factory=dict)  # (node, k) -> its getitem node
    ready: bool = False
    watched: bool = False
    note: str = ""
    module: Any = None
    calls: dict[str, deque[CallSite]] = field(default_factory=dict)  # kernel name -> its calls, in order
    handles: list[str] = field(default_factory=list)
    written: dict[str, Written] = field(default_factory=dict)  # C++ kernel -> the arguments it writes
    shadows: Shadows | None = None  # the watched call's storage, as its kernels write it
    to_post: dict[str, list[str]] = field(default_factory=dict)  # cppCodeToPost
    post_to_pre: dict[str, list[str]] = field(default_factory=dict)
    pre_to_post: dict[str, list[str]] = field(default_factory=dict)
    stacks: dict[str, list[str]] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)
    ops: dict[str, int] = field(default_factory=dict)  # Dynamo op -> its index in ``records``
    tainted: set[str] = field(default_factory=set)  # Dynamo ops that draw, or read a draw


def _draws(n: torch.fx.Node) -> bool:
    """Whether a post-grad node draws random numbers: an op torch tags ``nondeterministic_seeded``
    (or Inductor's own ``inductor_random``), unless its ``dropout_p`` is 0 (attention in eval)."""
    if "random" in str(n.target):
        return True
    if torch.Tag.nondeterministic_seeded not in getattr(n.target, "tags", ()):
        return False
    schema = getattr(n.target, "_schema", None)
    for i, a in enumerate(getattr(schema, "arguments", ())):
        if a.name == "dropout_p":
            p = n.kwargs.get("dropout_p", n.args[i] if i < len(n.args) else a.default_value)
            return bool(p != 0)
    return True


class KernelWatch:
    """The ``--per-kernel`` observer: :meth:`attach` it to a :class:`CompiledSide`, compile and run
    the model inside :meth:`recording`, then run it once more with the watch as the side's observer;
    :meth:`checks` are the kernels in execution order."""

    def __init__(self, model: nn.Module, *, rtol: float, atol: float) -> None:
        self.paths = module_paths(model)
        self.rtol, self.atol = rtol, atol
        self.graphs: list[_Graph] = []
        self.events: list[Event] | None = None
        self.current: _Graph | None = None
        self.found: list[KernelCheck] = []
        self.notes: list[str] = []

    # ---- compiling -------------------------------------------------------------------------------

    def attach(self, side: CompiledSide) -> None:
        real = side.real

        def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
            g = _Graph(gm, op_records(gm, self.paths), ops={n.name: i for i, n in enumerate(op_nodes(gm))})
            self.graphs.append(g)
            events = self.events if self.events is not None else []
            g.start = len(events)
            self.current = g
            try:
                return real(gm, example_inputs)
            finally:
                self.current = None
                g.stop = len(events)

        side.real = backend

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        """Torch's structured trace with provenance tracking, Inductor's and AOT Autograd's caches
        off, and each kernel's scheduler nodes read as Inductor records its provenance."""
        from torch._functorch import config as functorch_config
        from torch._inductor import config as inductor_config

        with structured_trace() as events, inductor_config.patch(fx_graph_cache=False), \
                functorch_config.patch(enable_autograd_cache=False), self._provenance():
            self.events = events
            try:
                yield
            finally:
                self.events = list(events)

    @contextlib.contextmanager
    def _provenance(self) -> Iterator[None]:
        import importlib

        import torch._inductor.debug as debug

        original = debug.set_kernel_post_grad_provenance_tracing

        def tracing(node_schedule: Any, kernel_name: str, is_extern: bool = False) -> Any:
            handle = original(node_schedule, kernel_name, is_extern)
            g = self.current
            if g is not None and handle is not None:
                try:
                    self._buffers(g, f"{kernel_name}:{handle}", node_schedule, is_extern)
                except Exception as e:  # noqa: BLE001 - a record fxviz cannot read: that kernel goes uncompared
                    g.note = g.note or f"Inductor's record of {kernel_name} could not be read ({type(e).__name__})"
            return handle

        # codegen modules bind the name when they are imported; the rest import it when they call it
        bound = []
        for name in ("torch._inductor.codegen.cpp", "torch._inductor.codegen.triton"):
            with contextlib.suppress(Exception):
                mod = importlib.import_module(name)
                if getattr(mod, "set_kernel_post_grad_provenance_tracing", None) is original:
                    bound.append(mod)
        debug.set_kernel_post_grad_provenance_tracing = tracing
        for mod in bound:
            mod.set_kernel_post_grad_provenance_tracing = tracing  # type: ignore[attr-defined]
        try:
            yield
        finally:
            debug.set_kernel_post_grad_provenance_tracing = original
            for mod in bound:
                mod.set_kernel_post_grad_provenance_tracing = original  # type: ignore[attr-defined]

    def _buffers(self, g: _Graph, handle: str, node_schedule: Any, is_extern: bool) -> None:
        """Which post-grad node each buffer of the kernel holds (``origin_node``; an extern kernel
        with none: the last node it covers, in graph order), and the post-grad graph's order, sizes,
        reshapes and random draws, from the nodes Inductor hands its provenance record."""
        found: dict[str, str | None] = g.buffers.setdefault(handle, {})
        ir_nodes = [(node_schedule.get_name(), node_schedule)] if is_extern else [
            (b.get_name(), s.node) for s in node_schedule if getattr(s, "node", None) is not None
            for b in s.get_outputs()]
        for name, node in ir_nodes:
            origin = node.get_origin_node() if hasattr(node, "get_origin_node") else None
            origins = list(getattr(node, "origins", ()))
            if not g.order and origins:
                self._post_grad(g, origins[0].graph)
            if origin is None and is_extern and origins:  # a fallback op: the last node it covers (the
                origin = max(origins, key=lambda o: g.order.get(o.name, -1))  # others: its inputs' views)
                if not isinstance(origin.meta.get("val"), (tuple, list)):
                    # Inductor names the node whose lowering returned this buffer; an extern call it
                    # did not return is part of a lowering (a frozen linear's MKL call, its bias
                    # added after), unless it computes a tuple (its items are the node's getitems)
                    origin = None
            found[name] = origin.name if origin is not None else None

    @staticmethod
    def _post_grad(g: _Graph, graph: torch.fx.Graph) -> None:
        for i, n in enumerate(graph.nodes):
            g.order[n.name] = i
            val = n.meta.get("val")
            try:
                g.numel[n.name] = int(val.numel()) if isinstance(val, torch.Tensor) else None
            except Exception:  # noqa: BLE001 - a symbolic size: matched by position only
                g.numel[n.name] = None
            if n.op != "call_function":
                continue
            if _draws(n):
                g.random.add(n.name)
            if str(getattr(n.target, "overloadpacket", n.target)) in _RESHAPES:
                g.views.add(n.name)
            if n.target is operator.getitem and isinstance(n.args[0], torch.fx.Node) and isinstance(n.args[1], int):
                g.items[(n.args[0].name, n.args[1])] = n.name

    def _read(self, g: _Graph) -> None:
        """The compile's trace events: output code, node mappings, kernel stack traces."""
        g.ready = True
        events = (self.events or [])[g.start:g.stop]
        trace = read_events(events)
        artifacts = [a for c in trace.compiles for a in c.artifacts]
        code = next((a for a in artifacts if a.name == "inductor_output_code"), None)
        mapping = next((a for a in artifacts if a.name == "inductor_provenance_tracking_node_mappings"), None)
        stacks = next((a for a in artifacts if a.name == "inductor_provenance_tracking_kernel_stack_traces"), None)
        if code is None or not isinstance(code.payload, str):
            g.note = g.note or "no output code in torch's trace of this graph's compile"
            return
        maps = mapping.payload if mapping is not None and isinstance(mapping.payload, dict) else {}
        g.to_post = {k: list(v) for k, v in (maps.get("cppCodeToPost") or {}).items()}
        g.post_to_pre = {k: list(v) for k, v in (maps.get("postToPre") or {}).items()}
        g.pre_to_post = {k: list(v) for k, v in (maps.get("preToPost") or {}).items()}
        g.stacks = dict(stacks.payload) if stacks is not None and isinstance(stacks.payload, dict) else {}
        drawn = {pre for p in g.random for pre in g.post_to_pre.get(p, ())}
        for n in g.gm.graph.nodes:  # what reads a draw, at any distance: the compiled code draws its own
            if n.name in drawn or any(a.name in g.tainted for a in n.all_input_nodes):
                g.tainted.add(n.name)
        g.handles = list(g.to_post)
        parsed = parse_output_code(code.payload)
        lines = code.payload.splitlines()
        for k in parsed.kernels:
            if k.kind == "cpp" and 0 < k.line <= len(lines):
                written = cpp_written(lines[k.line - 1], k.source)
                if written is not None:
                    g.written[k.name] = written
        for c in parsed.calls:
            call = call_site(c.handle, c.name, c.kind, lines[c.line - 1] if 0 < c.line <= len(lines) else "")
            g.calls.setdefault(c.name, deque()).append(call)
            if c.handle not in g.handles:
                g.handles.append(c.handle)
        path = str(code.meta.get("file_path") or code.meta.get("filename") or "")
        g.module = loaded_module(path)
        if g.module is None:
            g.note = g.note or f"the output code {path or '(no path)'} is not loaded in this process"

    # ---- the watched call ------------------------------------------------------------------------

    def graph_call(self, index: int, call: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        g = self.graphs[index] if index < len(self.graphs) else None
        if g is None or g.watched:
            return call(*args, **kwargs)
        g.watched = True
        boxed = getattr(call, "_boxed_call", False) and len(args) == 1 and isinstance(args[0], list)
        try:  # fxviz's own failure here is a note, never the model's: the graph then runs unwatched
            if not g.ready:
                self._read(g)
            if g.module is not None:
                inputs = list(args[0] if boxed else args)
                held = {n for bufs in g.buffers.values() for n in bufs.values() if n} | set(g.items.values())
                g.values = eager_values(g.gm, inputs, {pre for n in held for pre in g.post_to_pre.get(n, ())})
                # the call's inputs, and the output code's own constants (frozen parameters, folded
                # constants: computed eagerly when it compiled)
                g.shadows = Shadows(inputs + [v for v in vars(g.module).values() if isinstance(v, torch.Tensor)])
                del inputs
        except Exception as e:  # noqa: BLE001
            g.module, g.note = None, g.note or f"not watched: {type(e).__name__}: {e}"
        if g.module is None:
            self._unobserved(g)
            return call(*args, **kwargs)
        ns = g.module.__dict__
        saved: dict[str, Any] = {}
        hooks = _Hooks(self, g)
        try:
            dotted = {name for name in g.calls if "." in name}
            for name in list(g.calls):
                head = name.split(".", 1)[0]
                if head not in ns or head in saved:
                    continue
                saved[head] = ns[head]
                ns[head] = Dotted(ns[head], head, dotted, hooks) if "." in name else \
                    wrap_kernel(name, ns[name], g.written.get(name), hooks)
            return call(*args, **kwargs)
        finally:
            ns.update(saved)
            g.values, g.shadows = {}, None
            self._unobserved(g)

    def watching_aten(self) -> bool:
        return False

    def aten_value(self, node: torch.fx.Node, value: Any) -> Any:
        return value

    def _before(self, g: _Graph, name: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                written: Written | None) -> Isolated | None:
        """A kernel call is about to run: its arguments on eager's values, for :meth:`_ran` to run it on."""
        pending = g.calls.get(name)
        if not pending or g.shadows is None:
            return None
        c = pending[0]
        draws = any(p in g.random for p in g.to_post.get(c.handle, ()))
        return isolate(g.shadows, name, c.kind, c.args, args, kwargs, written, draws)

    def _ran(self, g: _Graph, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
             written: Written | None, isolated: Isolated | None, rerun: Rerun) -> None:
        """A kernel call finished: compare what it wrote, then what it writes on eager's inputs."""
        pending = g.calls.get(name)
        if not pending:
            return
        c = pending.popleft()
        held = g.buffers.get(c.handle, {})
        wrote: list[tuple[str, str | None, Any, tuple[str, int]]] = []  # (buffer, post-grad node, value, its place)
        if written is not None:  # a generated kernel: the pointers it writes
            for i in written.positions:
                buf = c.args[i] if i < len(c.args) else ""
                if i < len(args):
                    wrote.append((buf, held.get(buf), args[i], ("arg", i)))
        elif "out" in kwargs:
            wrote.append((c.out, held.get(c.out), kwargs["out"], ("out", 0)))
        elif isinstance(out, (tuple, list)):  # a fallback op with several results: item i is getitem(node, i)
            node = held.get(c.result)
            wrote.extend((f"{c.result}[{i}]", g.items.get((node, i)) if node else None, t, ("item", i))
                         for i, t in enumerate(out))
        else:
            wrote.append((c.result, held.get(c.result), out, ("result", 0)))
        kernel = KernelCheck(c.handle, self.graphs.index(g), c.kind, observed=True)
        eager: list[tuple[torch.Tensor, BufferCheck, torch.Tensor | None, tuple[str, int]]] = []
        for buf, node, t, place in wrote:
            if isinstance(t, torch.Tensor):
                check, value = self._check(g, buf, node, t)
                kernel.buffers.append(check)
                eager.append((t, check, value, place))
        result: Any = None
        if isolated is None or isolated.why:
            kernel.own_note = isolated.why if isolated is not None else "its arguments were not seen before it ran"
        else:  # the same kernel on eager's values of what it reads: its own error
            with torch.no_grad():
                result = rerun(isolated.args, isolated.kwargs or {})
            kernel.own_note = "; ".join(isolated.borrowed)
        for t, check, value, place in eager:
            mine = placed(isolated, result, place) if isolated is not None and not isolated.why else None
            if not isinstance(mine, torch.Tensor) or mine.numel() != t.numel():
                mine = None
            if value is not None and mine is not None:
                check.own = compare(value, mine.reshape(value.shape), self.rtol, self.atol)
            if g.shadows is not None:
                g.shadows.wrote(t, value, f"{check.buffer or 'an input'} holds no eager value ({check.error.note})",
                                derived=mine, by=c.handle)
        self._describe(g, kernel)
        self.found.append(kernel)

    def _check(self, g: _Graph, buf: str, node: str | None, tensor: torch.Tensor) -> tuple[BufferCheck, torch.Tensor | None]:
        """The buffer against eager, and eager's value of what it holds (``None``: not comparable)."""
        if node is None:
            return BufferCheck(buf, "", "", Error(comparable=False, note=_PARTIAL)), None
        pres = g.post_to_pre.get(node, [])
        if not pres:
            return BufferCheck(buf, node, "", Error(comparable=False, note="no Dynamo op in torch's provenance")), None
        for pre in pres:
            eager = g.values.get(pre)
            if not isinstance(eager, torch.Tensor) or self._value_node(g, pre, eager.numel()) != node:
                continue
            if pre in g.tainted:
                return BufferCheck(buf, node, pre, Error(
                    comparable=False, note="a random op's draw, or reads one: the compiled code draws its own numbers")), None
            if eager.numel() != tensor.numel():
                return BufferCheck(buf, node, pre, Error(comparable=False, note="sizes differ")), None
            other = tensor if tensor.shape == eager.shape else tensor.reshape(eager.shape)
            return BufferCheck(buf, node, pre, compare(eager, other, self.rtol, self.atol)), eager
        inside = ", ".join(pres)
        return BufferCheck(buf, node, "", Error(
            comparable=False, note=f"an intermediate of {inside}: eager computes no such value")), None

    @staticmethod
    def _value_node(g: _Graph, pre: str, numel: int) -> str | None:
        """The post-grad node that carries Dynamo node ``pre``'s value: the last of its post-grad
        nodes (graph order) with as many elements, reshapes left out (they carry the value before them)."""
        nodes = [p for p in g.pre_to_post.get(pre, ())
                 if g.numel.get(p) in (numel, None) and p in g.order and p not in g.views]
        return max(nodes, key=lambda p: g.order[p]) if nodes else None

    def _describe(self, g: _Graph, kernel: KernelCheck) -> None:
        """The Dynamo ops a kernel covers, the op it is reported at, its module and line."""
        names = g.ops
        ops = {pre for post in g.to_post.get(kernel.handle, ()) for pre in g.post_to_pre.get(post, ())}
        kernel.ops = sorted((o for o in ops if o in names), key=names.__getitem__)
        compared = [b for b in kernel.buffers if b.error.comparable]
        worst = max(compared, key=lambda b: (b.error.exceeds, b.error.rel_rms)) if compared else None
        op = worst.eager if worst is not None else (kernel.ops[-1] if kernel.ops else "")
        if op in names:
            rec = g.records[names[op]]
            kernel.op = f"{op} ({rec.name})"
            kernel.module = rec.module
            kernel.source = f"{Path(rec.file).name}:{rec.line}" if rec.file else ""
        if not kernel.source:
            frames = [m for s in g.stacks.get(kernel.handle, ()) for m in _FRAME.findall(s)]
            if frames:
                kernel.source = f"{Path(frames[0][0]).name}:{frames[0][1]}"

    def _unobserved(self, g: _Graph) -> None:
        """The kernels of ``g`` torch names that did not run while watched."""
        seen = {k.handle for k in self.found if k.graph == self.graphs.index(g)}
        for h in g.handles:
            if h not in seen:
                kernel = KernelCheck(h, self.graphs.index(g), kind_of(h.rsplit(":", 1)[0]))
                self._describe(g, kernel)
                self.found.append(kernel)

    def checks(self) -> list[KernelCheck]:
        """Every kernel call, in execution order (those that did not run last); notes say what was
        not observed."""
        for g in self.graphs:
            if not g.watched:  # compiled, but not called while watched: its kernels are named
                g.watched = True
                if not g.ready:
                    self._read(g)
                self._unobserved(g)
            if g.note:
                self.notes.append(f"graph {self.graphs.index(g)}: {g.note}")
        return list(self.found)


class _Hooks:
    """The watch's :class:`~fxviz.analyze.numerics.kernelcode.Hooks` for one compiled graph's call:
    fxviz's own failure is a note, never the model's (that kernel goes uncompared)."""

    def __init__(self, watch: KernelWatch, g: _Graph) -> None:
        self.watch, self.g = watch, g

    def before(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], written: Written | None) -> Any:
        try:
            return self.watch._before(self.g, name, args, kwargs, written)
        except Exception as e:  # noqa: BLE001
            return Isolated(why=f"fxviz could not copy its arguments ({type(e).__name__}: {e})")

    def after(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, written: Written | None,
              token: Any, rerun: Rerun) -> None:
        try:
            self.watch._ran(self.g, name, args, kwargs, out, written, token, rerun)
        except Exception as e:  # noqa: BLE001
            self.g.note = self.g.note or f"{name} not compared: {type(e).__name__}: {e}"


__all__ = ["KernelWatch"]
