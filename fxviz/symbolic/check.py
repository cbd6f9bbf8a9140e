"""An exported program on the example inputs: run once for real, it confirms that the inputs run,
checks every runtime assertion export deferred (``torch._check(n == 2)`` becomes
``_assert_scalar``), and records which branch of each ``torch.cond`` the inputs take.

The program's own graph is run (not ``ExportedProgram.module()``, which would copy it), node by
node, with the bodies of ``cond``, ``no_grad`` and ``autocast`` run the same way so that a ``cond``
inside them is seen too; any other higher-order op runs as itself. The program takes the model's
parameters, buffers and constants as inputs: those it writes (export's graph keeps a BatchNorm's
in-place update of its statistics, a forward's ``x.add_(1)``) are given copies (buffers, constants
and inputs always), so the model and the user's inputs are left as found.

    >>> run = run_program(ep, flat)
    >>> run.error, run.taken
    (None, {cond: True})
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch.export.graph_signature import InputKind

from fxviz.ir import Assumption, SourceLoc
from fxviz.torchbridge.checks import forked_rng
from fxviz.torchbridge.normalize import FlatInputs
from fxviz.torchbridge.source import source_from_trace

#: The ops export's graphs check their deferred assumptions with.
ASSERT_TARGETS = frozenset({"_assert_scalar", "_assert_async", "_functional_assert_async",
                            "_functional_assert_scalar"})
_MESSAGE = re.compile(r"Runtime assertion failed for expression (?P<expr>.+?) on node '(?P<node>[^']*)'")


@dataclass
class ProgramRun:
    """What running the program taught: the branch each ``cond`` took, the assertions that held,
    and what the program raised (``error``) at which node (``failed``)."""

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


def _program_inputs(ep: torch.export.ExportedProgram, flat: FlatInputs) -> list[Any]:
    """The program's inputs in its signature's order: the model's state, then the user's tensors.
    Everything but the parameters is a copy: a schema does not always say what an op writes
    (``aten.batch_norm`` updates its running statistics unannounced), and buffers and inputs are
    small next to the weights; a parameter is copied when an op is known to write it."""
    written, nested = _writes(ep.graph_module)
    user = iter(flat.tensors)
    out: list[Any] = []
    for spec in ep.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            value: Any = next(user)
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            value = ep.state_dict[spec.target] if spec.target in ep.state_dict else ep.constants[spec.target]
        else:
            value = ep.constants[spec.target]
        name = getattr(spec.arg, "name", "")
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

    def graph(self, gm: torch.fx.GraphModule, args: Iterable[Any]) -> Any:
        nodes = list(gm.graph.nodes)
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
    return any(n.target is cond or _is_assert(n) for m in ep.graph_module.modules()
               if isinstance(m, torch.fx.GraphModule) for n in m.graph.nodes)


def run_program(ep: torch.export.ExportedProgram, flat: FlatInputs) -> ProgramRun:
    """Run ``ep`` once on the real inputs ``flat``, under ``no_grad``, the generators forked; what it
    raises is kept in the result, not raised."""
    run = ProgramRun()
    try:
        inputs = _program_inputs(ep, flat)
        with torch.no_grad(), forked_rng(flat.tensors):
            _Runner(run).graph(ep.graph_module, inputs)
    except Exception as e:
        run.error = e
    return run


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


__all__ = ["ASSERT_TARGETS", "ProgramRun", "has_checks", "python_spelling", "run_program", "runtime_assertions"]
