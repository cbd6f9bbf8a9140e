"""Every kind of pass a pipeline takes, as one kind of step: ``ExportedProgram -> ExportedProgram``.

A pass author writes one of: a function ``GraphModule -> GraphModule | None`` (changing the
module in place or returning a new one), a ``torch.fx.passes.infra`` ``PassBase`` or a function
returning ``PassResult``, a function ``ExportedProgram -> ExportedProgram`` (told apart by its
annotation, or given as :func:`on_program`), or a ``PassManager`` (each of its passes a stage of
its own). ``"decompose"`` is ``run_decompositions`` (with the pipeline's table, if any).

A step never changes the program it is given: a pass on a graph module runs on a copy of the
graph (nodes, meta dictionaries and code are new; parameters and submodules are shared), so every
earlier stage stays as it was, runnable and comparable.
"""

from __future__ import annotations

import copy
import inspect
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature, InputSpec, OutputSpec, TensorArgument
from torch.fx.passes.infra.pass_base import PassResult
from torch.fx.passes.infra.pass_manager import PassManager

from fxviz.analyze.pipeline.links import fill_values
from fxviz.errors import TargetError


@dataclass
class Step:
    """One stage's pass: its name, what kind of pass it is, and how to run it on a program.
    ``run`` returns the new program, whether the pass says it changed anything (``None``: it
    does not say; the pipeline compares the graphs), and the graph the pass was given (the
    program's own, or the copy it ran on: the ``from_node`` records torch leaves point at it)."""

    name: str
    kind: str
    run: Callable[[ExportedProgram], tuple[ExportedProgram, bool | None, torch.fx.Graph]]


def on_program(fn: Callable[[ExportedProgram], ExportedProgram]) -> Callable[[ExportedProgram], ExportedProgram]:
    """Mark ``fn`` as a pass on the whole ``ExportedProgram`` (for a function without annotations)."""
    fn.__fxviz_program_pass__ = True  # type: ignore[attr-defined]
    return fn


def pass_name(p: Any) -> str:
    fn = getattr(p, "func", p)  # functools.partial
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    if not inspect.isfunction(fn) and not inspect.ismethod(fn) and not isinstance(fn, type):
        name = type(fn).__name__  # an instance: a PassBase, a callable object
    return str(name)


def steps_of(passes: Sequence[Any], *, decompose_table: Any = None) -> list[Step]:
    """One :class:`Step` per pass (a ``PassManager`` gives one per pass it holds)."""
    out: list[Step] = []
    for p in passes:
        if isinstance(p, str):
            if p != "decompose":
                raise TargetError(f"pass {p!r} is not one fxviz knows by name: give 'decompose' or a pass object")
            out.append(decompose_step(decompose_table))
        elif isinstance(p, PassManager):
            out.extend(steps_of(p.passes, decompose_table=decompose_table))
        elif _is_program_pass(p):
            out.append(Step(pass_name(p), "program", _program_run(p)))
        elif callable(p):
            out.append(Step(pass_name(p), "graph module", _graph_module_run(p)))
        else:
            raise TargetError(
                f"pass {p!r} is a {type(p).__name__}, not a pass: give a function on a GraphModule or an "
                "ExportedProgram, a PassBase, a PassManager or 'decompose'"
            )
    return out


def decompose_step(table: Any = None) -> Step:
    def run(ep: ExportedProgram) -> tuple[ExportedProgram, bool | None, torch.fx.Graph]:
        return (ep.run_decompositions(table) if table is not None else ep.run_decompositions()), None, ep.graph

    return Step("decompose", "decompose", run)


def _is_program_pass(p: Any) -> bool:
    if getattr(p, "__fxviz_program_pass__", False):
        return True
    fn = getattr(p, "func", p)
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # unresolvable annotations: fall back to the raw ones below
        hints = dict(getattr(fn, "__annotations__", {}) or {})
    try:
        first = next(iter(inspect.signature(fn).parameters))
    except (TypeError, ValueError, StopIteration):
        return False
    hint = hints.get(first)
    return hint is ExportedProgram or "ExportedProgram" in str(hint)


def _program_run(fn: Callable[[ExportedProgram], Any]) -> Callable[[ExportedProgram], tuple[ExportedProgram, bool | None, torch.fx.Graph]]:
    def run(ep: ExportedProgram) -> tuple[ExportedProgram, bool | None, torch.fx.Graph]:
        # on a copy of the graph: a pass that changes the program in place leaves the stage before whole
        given = ep._update(copy_graph_module(ep.graph_module), ep.graph_signature)
        out = fn(given)
        if not isinstance(out, ExportedProgram):
            raise TypeError(f"a pass on an ExportedProgram must return one, got {type(out).__name__}")
        return out, None, given.graph

    return run


def _graph_module_run(fn: Callable[[torch.fx.GraphModule], Any]) -> Callable[[ExportedProgram], tuple[ExportedProgram, bool | None, torch.fx.Graph]]:
    def run(ep: ExportedProgram) -> tuple[ExportedProgram, bool | None, torch.fx.Graph]:
        gm = copy_graph_module(ep.graph_module)
        out = fn(gm)
        modified: bool | None = None
        if isinstance(out, PassResult):
            out, modified = out.graph_module, bool(out.modified)
        if out is None:
            out = gm
        if not isinstance(out, torch.fx.GraphModule):
            raise TypeError(
                f"a pass on a GraphModule must return None, a GraphModule or a PassResult, got {type(out).__name__}")
        fill_values(out.graph)
        return ep._update(out, updated_signature(ep.graph_signature, out)), modified, gm.graph

    return run


def copy_graph_module(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A new module over a copy of ``gm``'s graph: a pass may change it freely; the tensors and
    submodules it reads are shared, not copied."""
    new = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph), class_name=type(gm).__name__)
    new.meta.update(gm.meta)
    return new


def updated_signature(old: ExportGraphSignature, gm: torch.fx.GraphModule) -> ExportGraphSignature:
    """``old`` with its tensor arguments renamed after ``gm``'s placeholders and returned nodes, in
    order (a pass that replaces the node an output returns changes its name)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    returned = list(output.args[0])
    if len(placeholders) != len(old.input_specs) or len(returned) != len(old.output_specs):
        raise TypeError(
            f"the pass changed the program's inputs or outputs ({len(old.input_specs)} -> {len(placeholders)} "
            f"inputs, {len(old.output_specs)} -> {len(returned)} outputs): a pass may not")
    inputs = [InputSpec(s.kind, TensorArgument(n.name) if isinstance(s.arg, TensorArgument) else s.arg, s.target,
                        s.persistent) for s, n in zip(old.input_specs, placeholders, strict=True)]
    outputs = [OutputSpec(s.kind, TensorArgument(n.name) if isinstance(s.arg, TensorArgument)
                          and isinstance(n, torch.fx.Node) else s.arg, s.target)
               for s, n in zip(old.output_specs, returned, strict=True)]
    return ExportGraphSignature(input_specs=inputs, output_specs=outputs)


__all__ = ["Step", "copy_graph_module", "decompose_step", "on_program", "pass_name", "steps_of", "updated_signature"]
