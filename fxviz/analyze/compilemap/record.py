"""Run a model under torch.compile with a recording backend, and leave Dynamo as it was found.

The recording backend wraps the real one (``inductor``, ``aot_eager``, ``eager``, or any callable):
for each Dynamo graph it keeps the ops (name, module path, user source line) before handing the
graph on, and wraps the compiled callable to log each run, so the order in which graphs ran is
known (a graph after a break inside a loop runs many times). Graph breaks come from Dynamo's own
break log (``InstructionTranslatorBase.log_graph_break``: it has the break type, the reason and the
user's stack; patched for the run and restored); recompiles from the public ``guard_fail_fn``
hook of ``torch._dynamo.optimize`` (the failed guard, put in words by :func:`in_words` and mapped to
the input dimension by :func:`fxviz.analyze.compilemap.shapes.explain_fail`), one per compile id
(:func:`recompile_fails`). Every guard of each graph comes from the public ``guard_export_fn`` hook,
called with the frame's ``Guard`` objects once Dynamo has built its guard manager, and the symbolic
sizes and their guards from the frame's ShapeEnv, taken from the tracing context the backend is
called in (:mod:`.shapes`).

Dynamo's caches are per code object and cannot be saved: :func:`dynamo_state` resets them before
the run (a cached graph would skip the recording backend) and after it (so nothing recorded stays),
and restores Dynamo's config and counters. A reset also drops the compiled code of the user's other
``torch.compile``d functions: they compile again on their next call.
"""

from __future__ import annotations

import contextlib
import operator
import re
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch._dynamo as dynamo
from torch import nn
from torch.utils import _pytree as pytree

from fxviz.analyze.compilemap.records import (
    BreakRecord,
    GraphRecord,
    GuardFailRecord,
    OpRecord,
    Recording,
    compile_id,
    compiled_graph,
    in_words,
    recompile_fails,
)
from fxviz.analyze.compilemap.shapes import (
    every_guard,
    explain_fail,
    framework_loc,
    graph_inputs,
    read_shape_env,
    rename,
    user_names,
)
from fxviz.analyze.compilemap.state import written_inputs
from fxviz.errors import TargetError
from fxviz.ops import op_name, property_target
from fxviz.progress import stage
from fxviz.torchbridge.guard import Backups
from fxviz.torchbridge.opnames import op_target
from fxviz.torchbridge.source import source_from_trace

BACKENDS: tuple[str, ...] = ("inductor", "aot_eager", "eager")

_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_PATH_PART = re.compile(r"\._modules\['([^']*)'\]|\['([^']*)'\]|\[(\d+)\]")
_CHECKED = re.compile(r"^\[?(!?\d+(?:/\d+)+)\]?: ")  # a guard failure's compiled version: "1/0: len(args) == 2"


def real_backend(backend: str | Callable[..., Any], mode: str | None, dynamic: bool | None) -> Callable[..., Any]:
    """The backend torch.compile would use for ``backend`` and ``mode``."""
    if callable(backend):
        return backend
    if backend == "inductor":
        # what torch.compile(backend="inductor", mode=...) builds: the mode's Inductor config
        return torch._TorchCompileInductorWrapper(mode, None, dynamic)  # type: ignore[attr-defined,no-untyped-call]
    if mode is not None:
        raise TargetError(f"mode {mode!r} applies to the inductor backend only, not {backend!r}: leave --mode out")
    try:
        return dynamo.lookup_backend(backend)  # type: ignore[no-any-return]
    except Exception as e:  # noqa: BLE001 - Dynamo's own error says which backends exist
        raise TargetError(f"unknown torch.compile backend {backend!r}: use one of {', '.join(BACKENDS)}") from e


def module_paths(model: nn.Module) -> dict[int, str]:
    """``id(module)`` -> its path in ``model`` (Dynamo keys ``nn_module_stack`` by the id)."""
    out: dict[int, str] = {}
    for path, m in model.named_modules(remove_duplicate=False):
        out.setdefault(id(m), path)
    return out


def _dynamo_path(key: str, value: Any, paths: dict[int, str]) -> str:
    """The module path of one ``nn_module_stack`` entry: by the module's id in the key
    (``"140109678211920"``, ``"…@1"`` for a repeated call), else from the source text
    (``L['self'].h[0].attn`` -> ``h.0.attn``)."""
    head = key.split("@", 1)[0]
    if head.isdigit() and int(head) in paths:
        return paths[int(head)]
    text = value[0] if isinstance(value, tuple) else str(value)
    text = re.sub(r"^L\['self'\]\.?", "", text)
    text = _PATH_PART.sub(lambda m: "." + next(g for g in m.groups() if g is not None), text)
    return text.strip(".")


def _user_frame(stack_trace: str) -> tuple[str, int]:
    """The line the user wrote behind a Dynamo op: the innermost user frame of its ``stack_trace``
    as the eager tracer finds it (:func:`~fxviz.torchbridge.source.source_from_trace`, the tracer's
    :func:`~fxviz.torchbridge.source.is_user_file`), or ``("", 0)`` where the compiled code holds
    none (a ``torch.nn`` container's ``forward``: Dynamo keeps no frame of ``torch.nn.modules``; the
    eager op's line may then be the user's line that called the container, which :mod:`.match`
    does not ask for)."""
    src = source_from_trace(stack_trace)
    return (src.file, src.line) if src is not None else ("", 0)


def op_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The op nodes of a Dynamo graph, in order (placeholders, attributes and the output left out):
    the nodes :func:`op_records` describes, one for one."""
    return [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]


def op_records(gm: torch.fx.GraphModule, paths: dict[int, str]) -> list[OpRecord]:
    """The ops of a Dynamo graph, in order (:func:`op_nodes`)."""
    out = []
    for n in op_nodes(gm):
        if n.op == "call_function" and n.target is getattr and len(n.args) == 2 and isinstance(n.args[1], str):
            target = property_target(n.args[1])  # a tensor property (``w.T``), as the eager tracer records it
        elif n.op == "call_function":
            t = n.target  # a dispatcher op is named as every capture names it (mylib::op.default)
            target = op_target(t) or f"{getattr(t, '__module__', None) or ''}.{getattr(t, '__name__', str(t))}"
        elif n.op == "call_method":
            target = f"Tensor.{n.target}"
        else:
            target = type(gm.get_submodule(str(n.target))).__name__
        stack = n.meta.get("nn_module_stack") or {}
        module = ""
        if stack:
            key, value = list(stack.items())[-1]
            module = _dynamo_path(str(key), value, paths)
        file, line = _user_frame(n.meta.get("stack_trace") or "")
        out.append(OpRecord(op_name(target), module, file, line, n.name, call_kind(n)))
    return out


def call_kind(n: torch.fx.Node) -> str:
    """What a call node of a Dynamo graph is where it is no tensor op of the model's, though torch's
    ``graph_op_count`` counts it (every call node): ``"unpack"``, a ``getitem`` taking one output
    of a call that returned several (``q, k, v = x.split(...)``: the eager tracer records the split,
    Python unpacks its tuple); ``"no tensor"``, a call whose value holds no tensor
    (``torch._C._log_api_usage_once``, which ``nn.Module.__init__`` calls when the forward builds a
    module, ``ModuleList[:n]``; ``_set_grad_enabled``; size arithmetic); else ``""``."""
    if n.op == "call_function" and n.target is operator.getitem and n.args and isinstance(n.args[0], torch.fx.Node) \
            and isinstance(n.args[0].meta.get("example_value"), (tuple, list)):
        return "unpack"
    # Dynamo keeps the value it traced of each call (none where it made no tensor: a call it put in
    # the graph for its side effect)
    if not any(isinstance(v, torch.Tensor) for v in pytree.tree_leaves(n.meta.get("example_value"))):
        return "no tensor"
    return ""


class Recorder:
    """The recording backend and the hooks of one compile-map run."""

    def __init__(self, backend: str | Callable[..., Any], mode: str | None, dynamic: bool | None,
                 paths: dict[int, str]) -> None:
        self.real = real_backend(backend, mode, dynamic)
        self.dynamic = dynamic
        self.paths = paths
        self.rec = Recording()
        self.from_log = True  # breaks from Dynamo's break log; else from each graph's compile reason
        # graphs whose frame has not finished compiling (its guards come after the backend), with the
        # frame's ShapeEnv and the graph (its stack traces name the files of the guards' user lines)
        self.pending: list[tuple[GraphRecord, Any, torch.fx.GraphModule]] = []
        # id(ShapeEnv location) -> (the location, the user's stack there)
        self.stacks: dict[int, tuple[Any, list[tuple[str, int, str]]]] = {}
        self.backups = Backups()  # parameters the compiled graphs write in place, as they were
        # per input set: id(tensor) -> its name in the model's signature (input_ids, kwargs' keys)
        self.names: list[dict[int, str]] = []

    def backend(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        rec, index = self.rec, len(self.rec.graphs)
        code = _frame_code(gm)
        back = sum(1 for x in rec.graphs if x.phase == "backward")  # backward graphs are b0, b1, ...
        gid = f"b{back}" if rec.phase == "backward" else f"g{index - back}"
        aliases = user_names(gm, self.names[rec.input_set] if 0 <= rec.input_set < len(self.names) else {})
        g = GraphRecord(gid, code[0], code[1], code[2], rec.input_set, op_records(gm, self.paths), compile_id(),
                        inputs=graph_inputs(gm, aliases), phase=rec.phase, aliases=aliases)
        rec.graphs.append(g)
        ctx = torch._guards.TracingContext.try_get()
        self.pending.append((g, getattr(getattr(ctx, "fake_mode", None), "shape_env", None), gm))
        why = getattr(gm, "compile_subgraph_reason", None)
        if why is not None and getattr(why, "graph_break", False):
            g.ended = [(f.filename, f.lineno or 0, f.name, (f.line or "").strip()) for f in why.user_stack or ()]
            if not self.from_log:
                text = str(getattr(why, "reason", ""))
                rec.breaks.append(BreakRecord(text.split("\n", 1)[0], text, g.ended, rec.input_set, rec.phase))
        written = written_inputs(gm)  # before the real backend: AOT Autograd rewrites the graph
        stage(f"compiling graph {gid} ({code[0]}, {len(g.ops)} ops)")
        t0 = time.perf_counter()
        compiled = self.real(gm, example_inputs)
        g.compile_s = time.perf_counter() - t0

        def run(*args: Any, **kwargs: Any) -> Any:
            g.runs += 1
            rec.runs.append((index, rec.input_set))
            if written:  # the model's state this graph writes in place: copied before it does
                inputs = args[0] if len(args) == 1 and isinstance(args[0], list) else args  # boxed or not
                self.backups.keep(inputs[i] for i in written)
            return compiled(*args, **kwargs)

        if getattr(compiled, "_boxed_call", False):  # the caller passes one list it may clear: keep that
            run._boxed_call = True  # type: ignore[attr-defined]
        return run

    def guard_export(self, guards: Any) -> None:
        """A frame finished compiling: its graph's every guard, symbols and shape guards."""
        pending, self.pending = self.pending, []
        for g, env, gm in pending:
            g.guards = every_guard(guards)
            if env is not None and (env.guards or env.var_to_sources):
                files = sorted({f for n in gm.graph.nodes for f, _, _ in _FRAME.findall(n.meta.get("stack_trace") or "")})
                g.symbols, g.shape_guards = read_shape_env(env, self.stacks, files, g.aliases)
            self._size_of_recompile(g)
        self.stacks.clear()

    def _size_of_recompile(self, g: GraphRecord) -> None:
        """A symbolic guard's failure does not say the size that failed it: the graph of the
        recompile it caused (its compile id; else the next for the same function and input set) was
        traced with it."""
        for f in self.rec.guard_fails:
            ours = f.compile_id == g.compile_id if f.compile_id and g.compile_id else \
                (f.input_set, f.func, f.file) == (g.input_set, g.func, g.file) and _of(g, f.lines)
            if ours and f.dim is not None and f.reason.startswith(f"{f.input} dim {f.dim} ("):
                size = next((s.value for s in g.symbols if (s.kind, s.input, s.dim) == ("size", f.input, f.dim)), None)
                size = size if size is not None else _traced_size(g.inputs, f.input, f.dim)
                if size is not None:
                    head = f"{f.input} dim {f.dim} ("
                    rest = f.reason[len(head):].replace(") is outside", "), outside", 1)
                    f.reason = f"{f.input} dim {f.dim} is {size} (" + rest.replace(") does not satisfy", "), which does not satisfy", 1)

    def guard_fail(self, fail: Any) -> None:
        code = getattr(fail, "orig_code", None)
        func, file = getattr(code, "co_name", "?"), getattr(code, "co_filename", "")
        text = str(getattr(fail, "reason", fail)).split("\n", 1)[0]
        m = _CHECKED.match(text)
        checked, guard = (m.group(1), text[m.end():]) if m else ("", text)
        # the failed version's graph by its compile id; else this function's newest graph, by its
        # code's lines, not its name alone (every module's forward in one file is a "forward")
        lines = frozenset(line for _, _, line in code.co_lines() if line) if code is not None else frozenset()
        if checked and any(g.compile_id for g in self.rec.graphs):
            failed = next((g for g in reversed(self.rec.graphs) if g.compile_id == checked), None)
        else:
            named = [g for g in reversed(self.rec.graphs) if g.func == func and g.file == file]
            failed = next((g for g in named if _of(g, lines)), None)
        mine = rename(guard, failed.aliases) if failed else guard  # the user's input names, not args[1]
        name, dim, words, advice = explain_fail(mine, *((failed.symbols, failed.shape_guards) if failed else ((), ())))
        self.rec.guard_fails.append(GuardFailRecord(
            self.rec.input_set, func, file, getattr(code, "co_firstlineno", 0), words or in_words(mine),
            guard, name, dim, advice, lines, compile_id(), checked))

    def compile(self, model: nn.Module) -> Callable[..., Any]:
        return dynamo.optimize(self.backend, guard_fail_fn=self.guard_fail, guard_export_fn=self.guard_export,  # type: ignore[no-any-return]
                               dynamic=self.dynamic)(model)

    @contextlib.contextmanager
    def guard_stacks(self) -> Iterator[None]:
        """Keep the user's stack at each location the ShapeEnv records for a guard or a value range
        (``ShapeEnv._get_sloc``, patched for the run and restored): the ShapeEnv itself keeps one
        line, which is library code when the size was guarded inside a library call."""
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        original = getattr(ShapeEnv, "_get_sloc", None)
        if original is None:  # another torch: guards keep the line the ShapeEnv names
            yield
            return
        stacks = self.stacks

        def _get_sloc(env: Any, *args: Any, **kwargs: Any) -> Any:
            if not args and kwargs.get("framework_loc") is None:
                # torch names the first frame outside its own files: the caller, not this wrapper
                kwargs["framework_loc"] = framework_loc()
            sloc = original(env, *args, **kwargs)
            # by identity (a location holds a FrameSummary: not hashable); the location is kept
            # alive with its stack, so the id is not reused while the run lasts
            stacks[id(sloc)] = (sloc, [(f.filename, f.lineno or 0, (f.line or "").strip())
                                       for f in torch._guards.TracingContext.extract_stack()])
            return sloc

        ShapeEnv._get_sloc = _get_sloc  # type: ignore[method-assign,assignment]
        try:
            yield
        finally:
            ShapeEnv._get_sloc = original  # type: ignore[method-assign]

    @contextlib.contextmanager
    def breaks_logged(self) -> Iterator[None]:
        """Record each graph break Dynamo logs (type, reason, user stack) while the model runs, and
        the user's stack at each guard's location (:meth:`guard_stacks`)."""
        with self.guard_stacks(), self._breaks_logged():
            yield

    @contextlib.contextmanager
    def _breaks_logged(self) -> Iterator[None]:
        from torch._dynamo.symbolic_convert import InstructionTranslatorBase

        original = getattr(InstructionTranslatorBase, "log_graph_break", None)
        rec = self.rec
        if original is None:  # another torch: breaks come from the graphs' compile reasons instead
            self.from_log = False
            yield
            return

        def log_graph_break(tx: Any, *args: Any, **kwargs: Any) -> None:
            given = dict(zip(("code_options", "reason", "exc"), args, strict=False)) | kwargs
            reason, exc = given.get("reason", ""), given.get("exc")
            if exc is not None and not getattr(exc, "logged", False):
                stack = getattr(exc, "real_stack", None)
                if stack is None:
                    stack = torch._guards.TracingContext.extract_stack()
                frames = [(f.filename, f.lineno or 0, f.name, (f.line or "").strip()) for f in stack]
                rec.breaks.append(BreakRecord(str(getattr(exc, "gb_type", "") or type(exc).__name__),
                                              str(reason), frames, rec.input_set, rec.phase, compile_id=compile_id()))
            original(tx, *args, **kwargs)

        InstructionTranslatorBase.log_graph_break = log_graph_break  # type: ignore[method-assign,assignment]
        try:
            yield
        finally:
            InstructionTranslatorBase.log_graph_break = original  # type: ignore[method-assign]


def _traced_size(inputs: list[str], name: str, dim: int) -> int | None:
    """The size of ``name``'s dim ``dim`` in a graph's inputs (``x: (6, 8)``), when a number."""
    for text in inputs:
        head, _, shape = text.partition(": ")
        sizes = [p.strip() for p in shape.strip("()").split(",") if p.strip()]
        if head == name and dim < len(sizes) and sizes[dim].isdigit():
            return int(sizes[dim])
    return None


def _of(g: GraphRecord, lines: frozenset[int]) -> bool:
    """Was ``g`` traced from the function whose code has these ``lines`` (its outermost frame's
    line among them; any graph where the lines are not known)?"""
    return not lines or g.line in lines


def _frame_code(gm: torch.fx.GraphModule) -> tuple[str, str, int]:
    """The function a Dynamo graph was traced from: the outermost frame of its ops' stack traces
    (a resume function after a break is named ``torch_dynamo_resume_in_forward_at_12``)."""
    for n in gm.graph.nodes:
        frames = _FRAME.findall(n.meta.get("stack_trace") or "")
        if frames:
            file, line, func = frames[0]
            return func, file, int(line)
    return "?", "", 0


@contextlib.contextmanager
def dynamo_state() -> Iterator[None]:
    """Reset Dynamo's caches before and after; the run's counters start from zero (torch's count
    of its breaks and graphs is the run's own, not the process's); the config and counters are put
    back afterwards."""
    from torch._dynamo.utils import counters

    saved_counters = {k: Counter(v) for k, v in counters.items()}
    saved_config = dynamo.config.get_config_copy()
    dynamo.reset()
    counters.clear()
    try:
        yield
    finally:
        dynamo.reset()
        now = dynamo.config.get_config_copy()
        with warnings.catch_warnings():  # setting a deprecated key back warns that it is deprecated
            warnings.simplefilter("ignore")
            for key, value in saved_config.items():
                if key in now and now[key] != value:
                    setattr(dynamo.config, key, value)
        counters.clear()
        for k, v in saved_counters.items():
            counters[k].update(v)


#: the record types and their readings live in :mod:`.records`; named here too, where the recorder's users import them
__all__ = ["BACKENDS", "BreakRecord", "compiled_graph", "GraphRecord", "GuardFailRecord", "OpRecord", "Recorder", "Recording",
           "compile_id", "dynamo_state", "in_words", "module_paths", "op_nodes", "op_records", "real_backend",
           "recompile_fails"]
