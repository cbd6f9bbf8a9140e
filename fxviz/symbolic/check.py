"""An exported program on the example inputs: confirm, by running it once for real, what export did
not prove for them. Export runs the model on fake tensors, which proves shapes and dtypes through
each op's fake kernel; it leaves to run time what depends on tensor data: the runtime assertions it
deferred (``torch._check(n == 2)`` becomes ``_assert_scalar``), sizes bound to data (unbacked
symbols: ``.item()``, ``nonzero``), the branch each ``torch.cond`` takes; and a few fake kernels
let through operands whose dtypes the real kernel refuses (``linear`` on int64 inputs). A program
with none of these (GPT-2) is not run at all (:func:`needs_running`).

Where every check reads a few nodes and no tensor's size depends on data, only those nodes run
(:func:`check_slice`: a ``torch._check`` on a count of tokens runs the count, not the model behind
it), stepped node by node. Otherwise the program runs at full speed (its ``GraphModule``, on the
lifted inputs: cheaper than ``ExportedProgram.module()``, which copies it); only when that raises is
it stepped node by node, to name the node that failed. A program with a ``cond`` is stepped from the start, with the bodies of
``cond``, ``no_grad`` and ``autocast`` run the same way, so that the branch each ``cond`` takes is
seen; any other higher-order op runs as itself. The program takes the model's parameters, buffers
and constants as inputs: those it writes (export's graph keeps a BatchNorm's in-place update of its
statistics, a forward's ``x.add_(1)``) are given copies (buffers, constants and inputs always), so the
model and the user's inputs are left as found.

    >>> run = run_program(ep, flat)
    >>> run.ran, run.error, run.taken
    (True, None, {cond: True})
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch.export.graph_signature import InputKind
from torch.utils._sympy.symbol import SymT, symbol_is_type

from fxviz.ir import Assumption, SourceLoc
from fxviz.ops import ASSERTS, op_family
from fxviz.torchbridge.checks import forked_rng
from fxviz.torchbridge.normalize import FlatInputs
from fxviz.torchbridge.source import source_from_trace

#: The ops export's graphs check their deferred assumptions with.
ASSERT_TARGETS = frozenset({"_assert_scalar", "_assert_async", "_functional_assert_async",
                            "_functional_assert_scalar"})
_MESSAGE = re.compile(r"Runtime assertion failed for expression (?P<expr>.+?) on node '(?P<node>[^']*)'")


#: Export's checks that only running evaluates: all of :data:`fxviz.ops.ASSERTS` but the one on
#: tensor metadata (``.to(dtype)`` leaves one), which fake tensors have already proved.
_RUNTIME_CHECKS = (ASSERTS | ASSERT_TARGETS) - {"_assert_tensor_metadata"}
#: Op families whose fake kernels let operands of different dtypes through (``aten.linear`` on an
#: int64 input and a float weight gives a float result) where the CPU and CUDA kernels refuse them.
_DTYPE_CHECKED_AT_RUN_TIME = frozenset({"linear", "matmul", "conv"})


@dataclass
class ProgramRun:
    """What running the program taught: the branch each ``cond`` took, the assertions that held,
    and what the program raised (``error``) at which node (``failed``). ``ran`` is False when
    export had proved all the inputs need (:func:`needs_running`): nothing was run."""

    ran: bool = True
    taken: dict[torch.fx.Node, bool] = field(default_factory=dict)
    held: set[torch.fx.Node] = field(default_factory=set)
    failed: torch.fx.Node | None = None
    error: BaseException | None = None


def _is_assert(n: torch.fx.Node) -> bool:
    packet = getattr(n.target, "overloadpacket", None)
    return n.op == "call_function" and getattr(packet, "__name__", "") in ASSERT_TARGETS


def _writes(gm: torch.fx.GraphModule) -> tuple[set[str], bool]:
    """Placeholders of the top-level graph an op writes in place (by name), and whether a body of a
    higher-order op writes one of its own (then every input is copied: the mapping is the op's)."""
    top: set[str] = set()
    nested = False
    for module in gm.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for n in module.graph.nodes:
            schema = getattr(n.target, "_schema", None)
            if n.op != "call_function" or schema is None:
                continue
            for a, value in zip(schema.arguments, n.args, strict=False):
                if a.alias_info is not None and a.alias_info.is_write and isinstance(value, torch.fx.Node) \
                        and value.op == "placeholder":
                    if module is gm:
                        top.add(value.name)
                    else:
                        nested = True
    return top, nested


def _program_inputs(ep: torch.export.ExportedProgram, flat: FlatInputs, needed: set[str] | None = None) -> list[Any]:
    """The program's inputs in its signature's order: the model's state, then the user's tensors.
    Everything but the parameters is a copy: a schema does not always say what an op writes
    (``aten.batch_norm`` updates its running statistics unannounced), and buffers and inputs are
    small next to the weights; a parameter is copied when an op is known to write it. ``needed``:
    the placeholders that will be read (the others are ``None``); all when not given."""
    written, nested = _writes(ep.graph_module)
    user = iter(flat.tensors)
    out: list[Any] = []
    for spec in ep.graph_signature.input_specs:
        name = getattr(spec.arg, "name", "")
        value: Any = next(user) if spec.kind == InputKind.USER_INPUT else None
        if needed is not None and name not in needed:
            value = None
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            value = ep.state_dict[spec.target] if spec.target in ep.state_dict else ep.constants[spec.target]
        elif spec.kind != InputKind.USER_INPUT:
            value = ep.constants[spec.target]
        if isinstance(value, torch.Tensor) and (spec.kind != InputKind.PARAMETER or nested or name in written):
            value = value.detach().clone()
        out.append(value)
    return out


class _Runner:
    """Runs fx graphs node by node, dropping each value after its last reader."""

    def __init__(self, run: ProgramRun) -> None:
        self.run = run
        self.cond = torch.ops.higher_order.cond
        from torch._higher_order_ops.wrap import wrap_with_autocast, wrap_with_set_grad_enabled

        self.grad, self.autocast = wrap_with_set_grad_enabled, wrap_with_autocast

    def graph(self, gm: torch.fx.GraphModule, args: Iterable[Any], only: set[torch.fx.Node] | None = None) -> Any:
        """Runs ``gm`` on ``args``; ``only``: just these nodes (a slice closed under inputs), returning None."""
        nodes = list(gm.graph.nodes)
        if only is not None:
            nodes = [n for n in nodes if n in only or n.op == "placeholder"]
        last: dict[torch.fx.Node, torch.fx.Node] = {}
        for n in nodes:
            for a in n.all_input_nodes:
                last[a] = n
        dying: dict[torch.fx.Node, list[torch.fx.Node]] = {}
        for value, user in last.items():
            dying.setdefault(user, []).append(value)
        env: dict[torch.fx.Node, Any] = {}
        feed = iter(args)
        for n in nodes:
            if n.op == "placeholder":
                env[n] = next(feed)
            elif n.op == "get_attr":
                obj: Any = gm
                for part in str(n.target).split("."):
                    obj = getattr(obj, part)
                env[n] = obj
            elif n.op == "output":
                return torch.fx.node.map_arg(n.args[0], env.__getitem__)
            else:
                args_ = torch.fx.node.map_arg(n.args, env.__getitem__)
                kwargs = torch.fx.node.map_arg(n.kwargs, env.__getitem__)
                try:
                    env[n] = self.call(n, args_, kwargs)
                except Exception:
                    if self.run.failed is None:
                        self.run.failed = n
                    raise
                if _is_assert(n):
                    self.run.held.add(n)
            for value in dying.get(n, ()):
                env.pop(value, None)
        return None

    def call(self, n: torch.fx.Node, args: Any, kwargs: dict[str, Any]) -> Any:
        target = n.target
        if target is self.cond:
            pred, true_gm, false_gm, operands = args
            taken = bool(pred)
            self.run.taken[n] = taken
            return self.graph(true_gm if taken else false_gm, operands)
        if target is self.grad:
            enabled, body, *rest = args
            with torch.set_grad_enabled(enabled):
                return self.graph(body, rest)
        if target is self.autocast:
            device, dtype, enabled, cache, body, *rest = args
            with torch.autocast(device_type=device, dtype=dtype, enabled=enabled, cache_enabled=cache):
                return self.graph(body, rest)
        if n.op == "call_function":
            return target(*args, **kwargs)  # type: ignore[operator]
        raise NotImplementedError(f"an exported graph holds a {n.op} node ({n.name})")


def has_checks(ep: torch.export.ExportedProgram) -> bool:
    """Does the program hold a ``cond`` or a runtime assertion, which only running it evaluates?"""
    cond = torch.ops.higher_order.cond
    return any(n.target is cond or _is_assert(n) for m in _graphs(ep) for n in m.graph.nodes)


def needs_running(ep: torch.export.ExportedProgram, flat: FlatInputs | None = None) -> str | None:
    """Why the program must run on the example inputs to be confirmed for them, or None when export
    proved all they need: a ``cond`` (the branch taken), a runtime assertion or constraint, a size
    bound to tensor data, operands whose dtypes only the real kernel checks, or (given the inputs
    ``flat``) token ids beyond the embedding table they index (export never sees values)."""
    if flat is not None and _ids_out_of_range(ep, flat):
        return "ids beyond the embedding table"
    unbacked = (SymT.UNBACKED_INT, SymT.UNBACKED_FLOAT)
    if any(symbol_is_type(s, unbacked) for s in ep.range_constraints):
        return "a size bound to tensor data"
    cond = torch.ops.higher_order.cond
    for module in _graphs(ep):
        for n in module.graph.nodes:
            if n.target is cond:
                return "a torch.cond"
            why = _left_open(n)
            if why:
                return f"{why} ({n.name})"
    return None


def _left_open(n: torch.fx.Node) -> str:
    """What only running ``n`` confirms (``""``: nothing): a runtime check, a size read from tensor
    data, operands whose dtypes only the real kernel checks."""
    if n.op != "call_function":
        return ""
    packet = getattr(getattr(n.target, "overloadpacket", None), "__name__", "")
    if packet in _RUNTIME_CHECKS:
        return "a runtime check"
    if n.meta.get("unbacked_bindings"):
        return "a size bound to tensor data"
    if op_family(packet) in _DTYPE_CHECKED_AT_RUN_TIME and _dtypes_differ(n):
        return "operands of different dtypes"
    return ""


def check_slice(ep: torch.export.ExportedProgram, flat: FlatInputs | None = None) -> set[torch.fx.Node] | None:
    """The nodes that confirm everything export left open when run alone: each runtime check, each
    op whose dtypes only the real kernel checks, each size read from data, and what they read. None
    where the whole program must run: a higher-order op (a ``cond``'s branch, a region's body), a
    tensor whose size is bound to data (what reads it was traced for any such size, not this one),
    ids beyond an embedding table (that op raises, and is named)."""
    gm = ep.graph_module
    if any(isinstance(m, torch.fx.GraphModule) and m is not gm for m in gm.modules()):
        return None
    if flat is not None and _ids_out_of_range(ep, flat):
        return None
    targets: list[torch.fx.Node] = []
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        if isinstance(n.target, torch._ops.HigherOrderOperator):
            return None
        val = n.meta.get("val")
        if any(isinstance(t, torch.Tensor) and _sized_by_data(t) for t in (val if isinstance(val, (list, tuple)) else (val,))):
            return None
        if _left_open(n):
            targets.append(n)
    needed: set[torch.fx.Node] = set()
    while targets:
        n = targets.pop()
        if n not in needed:
            needed.add(n)
            targets.extend(n.all_input_nodes)
    return needed


def _sized_by_data(t: torch.Tensor) -> bool:
    """Is a size of ``t`` (a fake value of export's) bound to tensor data (an unbacked symbol)?"""
    unbacked = (SymT.UNBACKED_INT, SymT.UNBACKED_FLOAT)
    return any(isinstance(d, torch.SymInt) and any(symbol_is_type(s, unbacked) for s in d.node.expr.free_symbols)
               for d in t.shape)


def _ids_out_of_range(ep: torch.export.ExportedProgram, flat: FlatInputs) -> bool:
    """Does an ``embedding`` read a user input directly whose values fall outside its table? (One
    min/max over the ids: the common way real inputs break a program export proved.)"""
    user = iter(flat.tensors)
    inputs = {spec.arg.name: next(user, None) for spec in ep.graph_signature.input_specs
              if spec.kind == InputKind.USER_INPUT and hasattr(spec.arg, "name")}
    for n in ep.graph.nodes:
        if n.op != "call_function" or getattr(getattr(n.target, "overloadpacket", None), "__name__", "") != "embedding":
            continue
        weight, ids = n.args[0], n.args[1]
        t = inputs.get(ids.name) if isinstance(ids, torch.fx.Node) else None
        rows = getattr(weight.meta.get("val"), "shape", (None,))[0] if isinstance(weight, torch.fx.Node) else None
        if (isinstance(t, torch.Tensor) and t.numel() and isinstance(rows, int) and not t.is_floating_point()
                and (int(t.min()) < 0 or int(t.max()) >= rows)):
            return True
    return False


def _dtypes_differ(n: torch.fx.Node) -> bool:
    dtypes = {v.dtype for a in n.args if isinstance(a, torch.fx.Node)
              for v in (a.meta.get("val"),) if isinstance(v, torch.Tensor)}
    return len(dtypes) > 1


def _graphs(ep: torch.export.ExportedProgram) -> Iterable[torch.fx.GraphModule]:
    return (m for m in ep.graph_module.modules() if isinstance(m, torch.fx.GraphModule))


def run_program(ep: torch.export.ExportedProgram, flat: FlatInputs) -> ProgramRun:
    """Confirm ``ep`` on the real inputs ``flat``: run it once, under ``no_grad``, the generators
    forked, unless export proved all they need (:func:`needs_running`; then ``ran`` is False). What
    it raises is kept in the result, not raised, with the node that raised it."""
    if needs_running(ep, flat) is None:
        return ProgramRun(ran=False)
    run = ProgramRun()
    gm = ep.graph_module
    only = check_slice(ep, flat)
    stepped = only is not None or any(n.target is torch.ops.higher_order.cond for m in _graphs(ep) for n in m.graph.nodes)
    try:
        with torch.no_grad(), forked_rng(flat.tensors):
            if only is not None:  # the checks and what they read, nothing else
                _Runner(run).graph(gm, _program_inputs(ep, flat, {n.name for n in only if n.op == "placeholder"}), only)
            elif stepped:  # the branch each cond takes is seen only node by node
                _Runner(run).graph(gm, _program_inputs(ep, flat))
            else:
                gm(*_program_inputs(ep, flat))
                run.held.update(n for m in _always_run(gm) for n in m.graph.nodes if _is_assert(n))
    except Exception as e:
        run.error = e
        if not stepped:  # once more, node by node, to name the node that raised
            again = ProgramRun()
            try:
                with torch.no_grad(), forked_rng(flat.tensors):
                    _Runner(again).graph(gm, _program_inputs(ep, flat))
            except Exception as e2:
                run.error, run.failed, run.held = e2, again.failed, again.held
    return run


def _always_run(gm: torch.fx.GraphModule) -> Iterable[torch.fx.GraphModule]:
    """``gm`` and the bodies every run of it runs (``no_grad`` and ``autocast`` regions)."""
    from torch._higher_order_ops.wrap import wrap_with_autocast, wrap_with_set_grad_enabled

    yield gm
    for n in gm.graph.nodes:
        if n.target is wrap_with_set_grad_enabled or n.target is wrap_with_autocast:
            body = next((a for a in n.args if isinstance(a, torch.fx.Node) and a.op == "get_attr"), None)
            sub = getattr(gm, str(body.target), None) if body is not None else None
            if isinstance(sub, torch.fx.GraphModule):
                yield from _always_run(sub)


def runtime_assertions(ep: torch.export.ExportedProgram, run: ProgramRun | None) -> list[tuple[torch.fx.Node, Assumption]]:
    """Every assertion export deferred to run time, in every graph of the program, as an
    :class:`~fxviz.ir.Assumption` with its source line, and whether it holds for the example inputs
    (``None`` when they were not run, or the run stopped before it)."""
    out: list[tuple[torch.fx.Node, Assumption]] = []
    for module in ep.graph_module.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for n in module.graph.nodes:
            if not _is_assert(n):
                continue
            message = next((a for a in n.args if isinstance(a, str)), "")
            m = _MESSAGE.search(message)
            expr = python_spelling(m["expr"]) if m else (message or n.name)
            holds: bool | None = None
            if run is not None:
                holds = True if n in run.held else False if n is run.failed else None
            source: SourceLoc | None = source_from_trace(n.meta.get("stack_trace"))
            out.append((n, Assumption(expr, source, holds=holds, kind="assertion")))
    return out


def python_spelling(expr: str) -> str:
    """sympy's ``Eq(a, b)`` / ``Ne(a, b)`` at the top level as ``a == b`` / ``a != b``."""
    for fn, op in (("Eq(", "=="), ("Ne(", "!=")):
        if expr.startswith(fn) and expr.endswith(")"):
            inner, depth = expr[len(fn) : -1], 0
            for i, ch in enumerate(inner):
                depth += ch == "("
                depth -= ch == ")"
                if ch == "," and depth == 0:
                    return f"{inner[:i].strip()} {op} {inner[i + 1 :].strip()}"
    return expr


__all__ = [
    "ASSERT_TARGETS", "ProgramRun", "check_slice", "has_checks", "needs_running", "python_spelling", "run_program", "runtime_assertions",
]
