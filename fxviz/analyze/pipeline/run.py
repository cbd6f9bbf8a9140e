"""Run a pass pipeline: export (or a program given), then each pass, a stage after each.

For every stage: the pass runs on the program of the stage before (never changing it: see
:mod:`~fxviz.analyze.pipeline.steps`), its wall time is taken, the new program becomes an fxviz
graph through the same conversion and passes a capture uses, its nodes are tied to the stage
before (:mod:`~fxviz.analyze.pipeline.links`), and, with ``numbers``, its outputs are compared with
eager PyTorch (:mod:`~fxviz.analyze.pipeline.numbers`). A pass that raises ends the pipeline with
a failed stage that holds the graph it was given and the frame of the pass code that raised.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.export import ExportedProgram
from torch.utils import _pytree as pytree

import fxviz.analyze.pipeline.links as linking
import fxviz.analyze.pipeline.numbers as num
from fxviz.analyze.pipeline.result import Divergence, Numbers, Pipeline, Stage, StageError
from fxviz.analyze.pipeline.steps import Step, steps_of
from fxviz.errors import CaptureError, TargetError
from fxviz.ir import Graph
from fxviz.passes import DEFAULT, run_passes
from fxviz.render.view import node_origin
from fxviz.symbolic.export import graph_from_exported
from fxviz.symbolic.pt2 import _load as _load_pt2  # the one .pt2 loader: clear errors, pytree classes
from fxviz.symbolic.pt2 import graph_from_program, output_names
from fxviz.text import one_line
from fxviz.torchbridge.normalize import NormalizedModel, flatten_inputs
from fxviz.torchbridge.run import gc_paused, normalize_args, quiet_torch
from fxviz.torchbridge.source import error_location

#: What ``fxviz.pipeline`` runs after export when no passes are given: core ATen.
DEFAULT_PASSES: tuple[str, ...] = ("decompose",)


@dataclass
class _Run:
    """What every stage of one run shares: how to turn a program into a graph, the inputs, eager's outputs."""

    model: nn.Module | None
    flat: Any = None
    box: dict[str, Any] = field(default_factory=dict)
    user: list[Any] = field(default_factory=list)
    want: list[Any] | None = None
    out_names: list[str] = field(default_factory=list)
    note: str = ""
    fx_links: dict[int, linking.Links] = field(default_factory=dict)

    def graph(self, ep: ExportedProgram, method: str) -> Graph:
        if self.model is not None:
            g = graph_from_exported(ep, self.model, self.flat, self.box, method=method)
        else:
            g = graph_from_program(ep, method=method)
        return run_passes(g, DEFAULT)


def pipeline(
    model_or_program: nn.Module | ExportedProgram,
    args: Any = (),
    kwargs: dict[str, Any] | None = None,
    *,
    passes: Sequence[Any] | None = None,
    decompose_table: Any = None,
    numbers: bool = True,
) -> Pipeline:
    """Export ``model`` on ``args``/``kwargs`` (or start from an ``ExportedProgram``), run
    ``passes`` in order and return every stage (see :class:`~fxviz.analyze.pipeline.result.Pipeline`).

    ``passes`` (default: ``["decompose"]``, core ATen) holds functions on a ``GraphModule`` (in
    place, or returning one or a ``PassResult``), ``PassBase`` objects, functions on an
    ``ExportedProgram``, ``PassManager`` objects (each of their passes a stage) and ``"decompose"``
    (``run_decompositions(decompose_table)``). With ``numbers``, each stage runs on the inputs
    and is compared with eager PyTorch; ``first_divergence`` names the first stage out of tolerance
    and the node there whose value first differs from the stage before.

        >>> p = fxviz.pipeline(model, (x,))
        >>> [(s.name, s.ops_after.get("aten.addmm.default", 0)) for s in p.stages]
        [('export', 0), ('decompose', 2)]
    """
    steps = steps_of(DEFAULT_PASSES if passes is None else passes, decompose_table=decompose_table)
    with gc_paused():  # as a capture does: the collector's full sweeps cost tracing up to half its time
        return _pipeline(model_or_program, args, kwargs, steps, numbers)


def _pipeline(model_or_program: nn.Module | ExportedProgram, args: Any, kwargs: dict[str, Any] | None,
              steps: list[Step], numbers: bool) -> Pipeline:
    if isinstance(model_or_program, ExportedProgram):
        run, ep, name = _from_program(model_or_program, args, kwargs), model_or_program, "program"
        t_start = 0.0
    else:
        run, ep, t_start = _from_model(model_or_program, args, kwargs, numbers)
        name = "export"
    title = type(run.model).__name__ if run.model is not None else ""
    result = Pipeline(title)
    first = Stage(0, name, run.graph(ep, "export"), t_start, kind=name, program=ep)
    first.ops_after = _ops(first.graph)
    result.name = result.name or first.graph.name
    if numbers and not run.note:
        if run.want is None:  # a program given: its own outputs are the reference
            run.want = num.run_program(ep, run.user)
        first.numbers = _check(ep, run)
    result.stages.append(first)
    for step in steps:
        stage = _stage(run, result.stages[-1], step, len(result.stages), numbers and not run.note)
        result.stages.append(stage)
        if stage.failed:
            break
    if run.note and numbers:
        result.notes.append(run.note)
    if numbers and not run.note:
        result.first_divergence = _divergence(run, result)
    return result


def load_program(path: str | os.PathLike[str]) -> ExportedProgram:
    """The ``ExportedProgram`` saved in ``path`` by ``torch.export.save`` (a :class:`TargetError`
    that says why when it cannot be loaded)."""
    name = os.fspath(path)
    if not os.path.isfile(name):
        raise TargetError(f"{name!r} is not a file: give a program written by torch.export.save(program, 'model.pt2')")
    return _load_pt2(name)


def _from_model(model: nn.Module, args: Any, kwargs: dict[str, Any] | None,
                numbers: bool) -> tuple[_Run, ExportedProgram, float]:
    args, kwargs = normalize_args(model, args, kwargs)
    flat = flatten_inputs(model, args, kwargs)
    run = _Run(model, flat, user=list(flat.tensors))
    wrapper = NormalizedModel(model, flat, run.box)
    t0 = time.perf_counter()
    try:
        with quiet_torch():
            ep = torch.export.export(wrapper, flat.tensors)
    except Exception as e:
        raise CaptureError(f"torch.export could not export {type(model).__name__}, so no pass can run: "
                           f"{type(e).__name__}: {one_line(str(e), limit=300)}") from e
    seconds = time.perf_counter() - t0
    run.out_names = [p for p, const in run.box.get("outputs", []) if const is None]
    run.note = num.no_numbers([*flat.tensors, *model.parameters(), *model.buffers()])
    if numbers and not run.note:  # eager's outputs: the reference every stage is compared with
        with torch.no_grad():
            out = wrapper(*flat.tensors)  # a flat dict of tensors by output path
            run.want = list(out.values()) if isinstance(out, dict) else list(out)
    return run, ep, seconds


def _from_program(ep: ExportedProgram, args: Any, kwargs: dict[str, Any] | None) -> _Run:
    given = (tuple(args) if isinstance(args, (tuple, list)) else (args,), dict(kwargs or {}))
    if not given[0] and not given[1] and ep.example_inputs is not None:
        given = ep.example_inputs
    user = [x for x in pytree.tree_leaves(given) if isinstance(x, torch.Tensor)]
    n_user = sum(1 for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT")
    note = "" if len(user) == n_user else (
        "no example inputs for this program: pass args (and kwargs) to check the numbers" if not user
        else f"the program takes {n_user} tensors, the inputs hold {len(user)}: numbers not checked")
    note = note or num.no_numbers([*user, *ep.state_dict.values()])
    return _Run(None, user=user, out_names=output_names(ep), note=note)


def _ops(graph: Graph) -> dict[str, int]:
    return dict(Counter(n.target for n in graph.nodes if n.kind == "op"))


def _stage(run: _Run, prev: Stage, step: Step, index: int, numbers: bool) -> Stage:
    before: ExportedProgram = prev.program
    t0 = time.perf_counter()
    try:
        with quiet_torch():
            after, modified, given = step.run(before)
    except Exception as e:  # the pass's own bug: keep what ran, show where it raised
        stage = Stage(index, step.name, prev.graph, time.perf_counter() - t0, kind=step.kind,
                      ops_before=prev.ops_after, ops_after=prev.ops_after, changed=False,
                      error=StageError(type(e).__name__, one_line(str(e), limit=500), error_location(e)))
        return stage
    seconds = time.perf_counter() - t0
    fx_links, fresh, gone = linking.link(before.graph, after.graph, given=given)
    linking.fill_meta(after.graph, before.graph, fx_links)
    graph = run.graph(after, f"{prev.graph.method or 'export'} + {step.name}")  # every pass so far, in order
    new_names = linking.ir_names(after.graph, graph)
    old_names = linking.ir_names(before.graph, prev.graph)
    links = linking.rename(fx_links, new_names, old_names)
    removed = linking.names(gone, old_names)
    gone_ir = set(removed)
    fresh_ir = linking.names(fresh, new_names)
    replaced = [n for n in fresh_ir if any(s in gone_ir for s, _ in links.get(n, ()))]
    replaced_set = set(replaced)
    added = [n for n in fresh_ir if n not in replaced_set]
    stage = Stage(index, step.name, graph, seconds, kind=step.kind, ops_before=prev.ops_after, ops_after=_ops(graph),
                  added=added, removed=removed, replaced=replaced, links=links,
                  changed=bool(fresh or gone) if modified is None else bool(modified and (fresh or gone)),
                  program=after)
    stage.changes = _changes(stage, prev.graph)
    run.fx_links[index] = fx_links
    if numbers:
        stage.numbers = _check(after, run)
    return stage


def _check(ep: ExportedProgram, run: _Run) -> Numbers:
    """The stage's numbers; a program that does not run says why in the note (no outputs compared)."""
    try:
        return num.check(ep, run.user, run.want or [], run.out_names)
    except Exception as e:  # a pass can leave a program that no longer runs: that is a finding
        return Numbers(note=f"the program does not run: {type(e).__name__}: {one_line(str(e), limit=300)}")


def _changes(stage: Stage, before: Graph) -> dict[str, dict[str, list[str]]]:
    """Added, replaced and removed node names by the module call they belong to."""
    out: dict[str, dict[str, list[str]]] = {}
    for what, graph, items in (("added", stage.graph, stage.added), ("replaced", stage.graph, stage.replaced),
                               ("removed", before, stage.removed)):
        tree = graph.calls
        for name in items:
            out.setdefault(tree.of(name).id, {}).setdefault(what, []).append(name)
    return out


def _divergence(run: _Run, p: Pipeline) -> Divergence | None:
    for s in p.stages:
        if s.numbers is None or not s.numbers.checked or s.numbers.ok:
            continue
        div = Divergence(s.index, s.name, max_abs=s.numbers.max_abs or 0.0)
        if s.index == 0:
            div.note = "the first stage already differs from eager"
            return div
        prev = p.stages[s.index - 1]
        try:
            found = num.first_differing_node(prev.program, s.program, run.fx_links.get(s.index, {}), run.user)
        except Exception as e:  # the stages ran whole, yet not node by node: name the stage only
            div.note = f"its nodes could not be compared one by one: {type(e).__name__}: {one_line(str(e), limit=200)}"
            return div
        if found is None:
            div.note = "no single node differs from the stage before: the difference builds up"
            return div
        new_names = linking.ir_names(s.program.graph, s.graph)
        old_names = linking.ir_names(prev.program.graph, prev.graph)
        div.node, div.previous, div.max_abs = new_names.get(found[0], found[0]), old_names.get(found[1], found[1]), found[2]
        if div.node in s.graph:
            div.where = node_origin(s.graph, div.node)
        return div
    return None


__all__ = ["DEFAULT_PASSES", "load_program", "pipeline"]
