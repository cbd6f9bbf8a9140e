"""The ``export`` and ``decompose`` sides: the ExportedProgram's graph run node by node by an fx
Interpreter *in step with* the eager run. When the eager run records an op that the alignment
(:func:`fxviz.graphdiff.diff`: per module call, then per op, folded to torch-level calls) pairs
with an exported node, the program is run up to that node and the two values are compared at once;
each program value is freed after its last use, so neither side holds all activations. A random
op of the program is given eager's value, so what follows compares the same draw.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.fx
from torch import nn
from torch.export.graph_signature import InputKind
from torch.utils import _pytree as pytree

from fxviz.analyze.compilemap.match import op_key
from fxviz.analyze.numerics.metrics import compare
from fxviz.analyze.numerics.pairing import Reads, ambiguous_ops, consistent
from fxviz.analyze.numerics.result import Error
from fxviz.analyze.numerics.run import Watcher, zero_unwritten
from fxviz.analyze.numerics.shadow import UNWRITTEN, is_random, is_uninitialised
from fxviz.errors import PassError, TargetError
from fxviz.graphdiff import diff
from fxviz.ir import Graph, Node
from fxviz.ops import DROPOUTS, RANDOM, op_name
from fxviz.symbolic.export import graph_from_exported
from fxviz.torchbridge.checks import first_line
from fxviz.torchbridge.normalize import NormalizedModel, flatten_inputs

#: Row statuses whose two sides compute the same value (``dtype`` would compare unlike values).
_ALIGNED = frozenset({"same", "decomposed", "shape"})


def export_program(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], *, decompose: bool,
                   decompositions: Mapping[Any, Any] | None) -> tuple[torch.export.ExportedProgram, Graph, list[Any]]:
    """Export ``model`` (non-strict, static sizes) as :func:`fxviz.capture` does, optionally
    decomposed (``decompositions`` added to torch's default table); the program, its graph and
    the program's inputs in placeholder order (buffers copied: the eager run may update them)."""
    flat = flatten_inputs(model, args, kwargs)
    box: dict[str, Any] = {}
    try:
        ep = torch.export.export(NormalizedModel(model, flat, box), flat.tensors, strict=False)
    except Exception as e:  # torch's own words, in one line, with what to do instead
        side = "decompose" if decompose else "export"
        raise TargetError(f"--against {side}: torch.export cannot export {type(model).__name__} ({first_line(e)}); "
                          "compare against compile:aot_eager or dtype:bfloat16 instead (fxviz tree --method export "
                          "says why export fails)") from e
    if decompose:
        table = torch.export.default_decompositions()
        table.update(dict(decompositions or {}))
        ep = ep.run_decompositions(table)
    graph = graph_from_exported(ep, model, flat, box, method="export-decomposed" if decompose else "export")
    return ep, graph, program_inputs(ep, flat.tensors)


def program_inputs(ep: torch.export.ExportedProgram, user_inputs: Sequence[Any]) -> list[Any]:
    """The inputs of ``ep.graph_module`` in placeholder order: lifted parameters, buffers (copied:
    the eager run may update them) and constants around the user's flat inputs."""
    user = iter(user_inputs)
    inputs: list[Any] = []
    for spec in ep.graph_signature.input_specs:
        target = spec.target or ""
        if spec.kind == InputKind.USER_INPUT:
            inputs.append(next(user))
        elif spec.kind == InputKind.PARAMETER:
            inputs.append(ep.state_dict[target])
        elif spec.kind == InputKind.BUFFER:
            b = ep.state_dict[target] if target in ep.state_dict else ep.constants[target]
            inputs.append(b.clone())
        else:
            inputs.append(ep.constants.get(target))
    return inputs


def stage_program(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], index: int,
                  passes: Sequence[Any] | None) -> tuple[torch.export.ExportedProgram, Graph, list[Any], str]:
    """Stage ``index`` of the pass pipeline (:func:`fxviz.analyze.pipeline.pipeline`: export, then
    ``passes``, by default ``decompose``): its program, graph and inputs, and its name."""
    from fxviz.analyze.pipeline import pipeline

    p = pipeline(model, args, kwargs, passes=passes, numbers=False)
    last = len(p.stages) - 1
    if not 0 <= index <= last:
        raise TargetError(f"stage:{index}: the pipeline has stages 0 to {last} "
                          f"({', '.join(f'{s.index} {s.name}' for s in p.stages)})")
    stage = p.stage(index)
    if stage.error is not None or stage.program is None:
        raise PassError(f"stage:{index} ({stage.name}) did not run: {stage.error}")
    flat = flatten_inputs(model, args, kwargs)
    return stage.program, stage.graph, program_inputs(stage.program, flat.tensors), stage.name


def aligned(program: Graph, eager: Graph) -> dict[str, str]:
    """Eager op node name -> the program node whose value is the same value, from the diff's rows:
    ops matched one for one pair up one for one; a torch-level call spelt differently (decomposed)
    pairs its last op on each side, the one whose output is the call's result."""
    pairs: dict[str, str] = {}
    decomposed: set[str] = set()
    for md in diff(program, eager).modules:
        for r in md.rows:
            if not (r.a and r.b) or r.status not in _ALIGNED:
                continue
            if len(r.a) == len(r.b) and r.status != "decomposed":
                pairs.update(zip(r.b, r.a, strict=True))
            else:
                pairs[r.b[-1]] = r.a[-1]
                decomposed.add(r.a[-1])
    # a pair the data flow contradicts is not the same value (Gemma2's masks: pairing.consistent)
    e_ops, p_ops = eager.ops, program.ops
    e_at = {n.name: i for i, n in enumerate(e_ops)}
    p_at = {n.name: i for i, n in enumerate(p_ops)}
    index = {p_at[x]: e_at[e] for e, x in pairs.items() if e in e_at and x in p_at}
    kept = consistent(index, Reads.of_eager(eager), Reads.of_eager(program), ambiguous_ops([op_key(n) for n in e_ops]),
                      loose={p_at[x] for x in decomposed if x in p_at}, settled=False)
    dropped = {e_ops[e].name for x, e in index.items() if x not in kept}
    return {e: x for e, x in pairs.items() if e not in dropped}


class ProgramWatcher(Watcher):
    """Steps ``gm`` (the program's graph module) as far as each aligned eager op needs and records
    the :class:`Error` of each (``errors``: eager node name -> one per output)."""

    def __init__(self, gm: torch.fx.GraphModule, inputs: list[Any], pairs: dict[str, str], *,
                 rtol: float, atol: float) -> None:
        self.rtol, self.atol = rtol, atol
        self.pairs = pairs
        self.wanted = set(pairs.values())
        self.nodes = [n for n in gm.graph.nodes if n.op != "output"]
        self.index = {n.name: i for i, n in enumerate(self.nodes)}
        self.last_use: dict[torch.fx.Node, int] = {}
        for i, n in enumerate(self.nodes):
            for m in n.all_input_nodes:
                self.last_use[m] = i
        self.free_at: dict[int, list[torch.fx.Node]] = {}
        for m, i in self.last_use.items():
            self.free_at.setdefault(i, []).append(m)
        self.interp = torch.fx.Interpreter(gm, garbage_collect_values=False)
        self.interp.env = {}
        self.interp.args_iter = iter(inputs)
        self.pos = 0
        self.pending: dict[str, Any] = {}
        self.given: dict[str, Any] = {}
        self.random = any(op_name(str(n.target)) in RANDOM | DROPOUTS for n in self.nodes)
        self.errors: dict[str, list[Error]] = {}
        self.not_comparable: list[str] = []

    def advance(self, name: str) -> None:
        """Run the program through node ``name`` (the eager run's RNG state is kept as it was)."""
        stop = self.index[name]
        if self.pos > stop:
            return
        rng = torch.random.get_rng_state() if self.random else None
        env = self.interp.env
        with torch.no_grad():
            while self.pos <= stop:
                n = self.nodes[self.pos]
                env[n] = self.interp.run_node(n)
                zero_unwritten(op_name(str(n.target)), env[n])
                if n.name in self.given:  # a random op: eager's draw, in the program's own structure
                    value, given = env[n], self.given.pop(n.name)
                    env[n] = type(value)([given, *value[1:]]) if isinstance(value, (tuple, list)) else given
                if n.name in self.wanted:
                    self.pending[n.name] = env[n]
                for m in self.free_at.get(self.pos, ()):
                    env.pop(m, None)
                if not n.users:
                    env.pop(n, None)
                self.pos += 1
        if rng is not None:
            torch.random.set_rng_state(rng)

    def after(self, node: Node | None, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
              out: Any, state: Any) -> None:
        if node is None:
            return
        x = self.pairs.get(node.name)
        if x is None or x not in self.index:
            return
        if is_random(node):
            self.not_comparable.append(node.name)
            if self.pos <= self.index[x] and isinstance(out, torch.Tensor):
                self.given[x] = out
            self.errors[node.name] = [Error(comparable=False, note="random op: the program is given eager's draw")]
            self.advance(x)
            self.pending.pop(x, None)
            return
        self.advance(x)
        value = self.pending.pop(x, None)
        if is_uninitialised(node):
            self.errors[node.name] = [Error(comparable=False, note=UNWRITTEN)]
            return
        eager_out = [o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
        other = [o for o in pytree.tree_leaves(value) if isinstance(o, torch.Tensor)]
        if len(eager_out) != len(other):
            if not (eager_out and other):
                return
            # one side spells the call with extra outputs (native_layer_norm's mean and rstd): the
            # result leads on both
            eager_out, other = eager_out[:1], other[:1]
        self.errors[node.name] = [compare(a, b, self.rtol, self.atol) for a, b in zip(eager_out, other, strict=True)]


__all__ = ["ProgramWatcher", "aligned", "export_program"]
