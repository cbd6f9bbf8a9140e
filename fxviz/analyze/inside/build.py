"""A structured trace -> what torch.compile did inside each compiled graph. No torch.

:func:`build` reads a :class:`~fxviz.tracefile.records.Trace` (a live run's events or a saved
``TORCH_TRACE`` directory, read by :mod:`fxviz.tracefile`): for each compile id with a Dynamo
graph, its stages (:mod:`.stages`), the kernel map of each output code (:mod:`.kernels`) and
its compile cost (:mod:`.costs`) and, from a live run, the fusions Inductor refused
(:mod:`.fusion`). Post-grad nodes go back to Dynamo's nodes through torch's
``postToPre``; Dynamo's nodes to the eager graph's ops and modules through the compile map's
matching (``eager_ops``: graph id -> Dynamo node -> eager op), when there is an eager graph.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fxviz.analyze.inside import comms, fusion
from fxviz.analyze.inside.backward import (
    FROM_TORCH,
    INFERRED_MODULES,
    apply_record,
    keep_recorded,
    narrow,
    recorded,
    refine,
)
from fxviz.analyze.inside.costs import cost
from fxviz.analyze.inside.kernels import kernel_map
from fxviz.analyze.inside.partition import read as read_partition
from fxviz.analyze.inside.result import Inside, InsideGraph
from fxviz.analyze.inside.stages import make_stage, op_nodes
from fxviz.analyze.pipeline.result import EXACT, INFERRED, Pipeline, Stage
from fxviz.ir import Graph
from fxviz.text import one_line
from fxviz.tracefile.code import OutputCode, parse_output_code
from fxviz.tracefile.fxtext import parse_graph
from fxviz.tracefile.records import Artifact, Compile, Trace

#: Stage seconds: the chromium events each stage's work is.
_SECONDS = {
    "dynamo": ("bytecode_tracing",),
    "pre-grad": ("_recursive_pre_grad_passes",),
    "joint": ("aot_collect_metadata", "aot_trace_joint_graph", "_recursive_joint_graph_passes"),
    "partition": ("min_cut_rematerialization_partition",),
}


def build(trace: Trace, *, eager_ops: Mapping[str, Mapping[str, str]] | None = None, eager: Graph | None = None,
          ids: Mapping[str, str] | None = None) -> Inside:
    """Everything inside torch.compile that ``trace`` records. ``eager_ops``: graph id -> Dynamo
    node -> eager op name (with ``eager``, the eager graph they are in); ``ids``: compile id ->
    the compile map's graph id (default ``g0``, ``g1``, ... in compile order)."""
    inside = Inside(notes=[str(p) for p in trace.problems[:20]])
    if len(trace.problems) > 20:
        inside.notes.append(f"... {len(trace.problems) - 20} more unreadable lines")
    k = 0
    listening = fusion.listening(trace)
    taken = {e for m in (eager_ops or {}).values() for e in m.values()}
    for c in trace.compiles:
        if c.first("dynamo_output_graph") is None:
            continue
        gid = (ids or {}).get(c.compile_id, f"g{k}")
        k += 1
        try:
            inside.graphs.append(_graph(c, gid, (eager_ops or {}).get(gid, {}), eager, inside.notes, trace.compiles,
                                        listening, taken))
        except Exception as e:  # noqa: BLE001 - one compile torch wrote oddly: say so, show the others
            inside.notes.append(f"compile {c.compile_id}: could not be read: {type(e).__name__}: {one_line(str(e), limit=200)}")
    if not listening and inside.kernels:
        inside.notes.append(fusion.NOT_IN_TRACE)
    return inside


def _parse(a: Artifact, name: str, notes: list[str]) -> Graph | None:
    text = a.payload if isinstance(a.payload, str) else None
    if not text:
        return None
    try:
        return parse_graph(text, name=name)
    except Exception as e:  # noqa: BLE001 - a graph torch printed that fxviz cannot read: note it
        where = f"{a.file}:{a.line}" if a.file else name
        notes.append(f"{where}: {name} not read: {type(e).__name__}: {one_line(str(e), limit=200)}")
        return None


def _code(a: Artifact, notes: list[str]) -> OutputCode | None:
    if not isinstance(a.payload, str):
        return None
    try:
        return parse_output_code(a.payload)
    except Exception as e:  # noqa: BLE001 - output code fxviz cannot read: note it, keep the stages
        notes.append(f"{a.file}:{a.line}: output code not read: {type(e).__name__}: {one_line(str(e), limit=200)}")
        return None


def _json(a: Artifact | None) -> dict[str, Any]:
    if a is None:
        return {}
    if isinstance(a.payload, dict):
        return a.payload
    try:
        d = json.loads(a.payload) if isinstance(a.payload, str) else {}
    except ValueError:
        return {}
    return d if isinstance(d, dict) else {}


def _seconds(c: Compile, key: str, nth: int = 0) -> float:
    names = _SECONDS.get(key, (key,))
    if key in _SECONDS:
        return sum(p.seconds for p in c.phases if p.name in names)
    hits = [p.seconds for p in c.phases if p.name == key]
    return hits[nth] if nth < len(hits) else 0.0


def _graph(c: Compile, gid: str, eager_ops: Mapping[str, str], eager: Graph | None, notes: list[str],
           trace_compiles: list[Compile] | None = None, listening: bool = False,
           taken: set[str] | None = None) -> InsideGraph:
    cid = c.label
    stages: list[Stage] = []

    def add(name: str, graph: Graph | None, base: Stage | None, seconds: float = 0.0,
            recorded: Mapping[str, Any] | None = None) -> Stage | None:
        if graph is None:
            return None
        s = make_stage(len(stages), name, graph, base, seconds=seconds, recorded=recorded)
        stages.append(s)
        return s

    dyn_art = c.first("dynamo_output_graph")
    dynamo = (_parse(dyn_art, f"{gid} Dynamo graph", notes) if dyn_art else None) or Graph(name=f"{gid} Dynamo graph")
    _set_origin(dynamo, {n: n for n in op_nodes(dynamo)}, eager_ops, eager, dynamo)
    # the collectives a DTensor call (one Dynamo op the pairing left alone) ran, as the eager tracer saw them
    under = comms.below(dynamo, eager, eager_ops, taken or set()) if eager is not None and eager_ops else {}
    s_dyn = add("Dynamo graph", dynamo, None, _seconds(c, "dynamo")) if dynamo.nodes else None
    pre_art = c.first("after_pre_grad_graph")
    s_pre = add("pre-grad passes", _parse(pre_art, f"{gid} after pre-grad passes", notes), s_dyn,
                _seconds(c, "pre-grad")) if pre_art else None
    inductor = pre_art is not None or c.first("inductor_post_grad_graph") is not None  # not aot_eager's
    if pre_art is None and inductor:
        notes.append(f"compile {cid}: no pre-grad graph recorded (AOT Autograd cache hit?): stages start at AOT")
    top = s_pre or s_dyn
    maps = [_json(a) for a in c.all("inductor_provenance_tracking_node_mappings")]
    fwd_post_to_pre: dict[str, list[str]] = dict(maps[0].get("postToPre") or {}) if maps else {}
    joint_art = c.first("aot_joint_graph")
    inf_art = c.first("aot_inference_graph")
    aot: dict[str, tuple[str, Artifact, Stage | None]] = {}
    if joint_art is not None:
        s_joint = add("AOT joint graph", _parse(joint_art, f"{gid} AOT joint graph", notes), top,
                      _seconds(c, "joint"), fwd_post_to_pre)
        for part, key in (("forward", "aot_forward_graph"), ("backward", "aot_backward_graph")):
            art = c.first(key)
            if art is not None:
                aot[part] = ("AOT " + part, art, s_joint)
    elif inf_art is not None:
        aot["inference"] = ("AOT inference graph", inf_art, top)
    posts = c.all("inductor_post_grad_graph")
    codes = c.all("inductor_output_code")
    kstacks = [_json(a) for a in c.all("inductor_provenance_tracking_kernel_stack_traces")]
    parts = [_code(a, notes) for a in codes]
    dyn_ops = op_nodes(dynamo)
    by_line: dict[tuple[str, int], list[str]] = {}
    for name, n in dyn_ops.items():
        if n.source is not None and n.source.line:
            by_line.setdefault((n.source.file, n.source.line), []).append(name)
    ig = InsideGraph(gid, cid, Pipeline(f"{gid} ({cid})"), cost=cost(c, gid))
    seen: list[str] = []
    torch_modules: dict[str, str] = {}  # backward node -> its module, as torch's record gives it
    for i, post_art in enumerate(posts):
        code = parts[i] if i < len(parts) else None
        part = (code.part if code is not None and code.part else "") or ("forward" if i == 0 else "backward")
        if part not in aot and "inference" in aot:
            part = "inference"
        entry = aot.pop(part, None) if part in aot else None
        base = top
        if entry is not None:
            label, art, b = entry
            b = b or top
            base = add(label, _parse(art, f"{gid} {label}", notes), b,
                       _seconds(c, "partition") if b is not top else 0.0, fwd_post_to_pre if b is top else None) or b
        post = _parse(post_art, f"{gid} post-grad ({part})", notes)
        s_post = _post_grad(c, i, gid, part, post, base, add, notes)
        if post is None or s_post is None:
            continue
        mapping = maps[i] if i < len(maps) else {}
        post_to_pre = dict(mapping.get("postToPre") or {})
        exact = bool(post_to_pre)
        if not exact:  # the backward: its recomputed forward nodes keep the forward's names
            post_to_pre = {n: fwd_post_to_pre[n] for n in op_nodes(post) if n in fwd_post_to_pre}
        lines = {name: found for name, n in op_nodes(post).items() if name not in post_to_pre and n.source is not None
                 and (found := by_line.get((n.source.file, n.source.line)))}
        record = recorded(c, part, seen.count(part)) if part == "backward" else None
        seen.append(part)
        if record is not None:
            torch_modules.update(record)
            keep_recorded(lines, record, lambda d: _module(d, eager_ops, eager, dynamo))
        narrow(post, lines, post_to_pre if exact else fwd_post_to_pre,
               lambda d: _module(d, eager_ops, eager, dynamo), aot=_stage_graph(stages, _AOT_OF.get(part, "")),
               dyn=dynamo, fwd=_stage_graph(stages, "AOT forward") if part == "backward" else None)
        post_to_pre.update(lines)
        resolved = comms.resolve(post, post_to_pre, under, eager) if under and eager is not None else {}
        _set_origin(post, post_to_pre, eager_ops, eager, dynamo, inferred=not exact, resolved=resolved)

        def origin(node: str, p2p: dict[str, list[str]] = post_to_pre,
                   res: dict[str, list[str]] = resolved) -> tuple[list[str], list[str]]:
            if node in res and eager is not None:
                return list(res[node]), list(dict.fromkeys(eager.node(e).module for e in res[node]))
            pre = p2p.get(node, [])
            ops = list(dict.fromkeys(eager_ops.get(d, d) for d in pre)) if eager_ops else list(pre)
            mods = list(dict.fromkeys(m for d in pre if (m := _module(d, eager_ops, eager, dynamo)) is not None))
            return ops, mods

        if code is None:
            notes.append(f"compile {cid}: no output code for the {part} graph: no kernels")
            continue
        km = kernel_map(post, code, mapping, kstacks[i] if i < len(kstacks) else {}, graph_id=gid, compile_id=cid,
                        part=part, origin=origin)
        ig.kernels += km.kernels
        if part == "backward":
            notes.append(_backward_note(cid, record, apply_record(km.kernels, record) if record else 0, km.kernels))
        decided = fusion.decisions(c, part)
        ig.not_fused += fusion.not_fused(fusion.refusals(decided), km.kernels, km.writers, graph_id=gid, compile_id=cid,
                                         part=part, origin=origin)
        note = fusion.cache_note(ig.cost, i, cid, part) if listening and not decided else None
        if note:
            notes.append(note)
        ig.unmapped.update(km.unmapped)
        ig.ops += km.ops
        ig.mapped += km.mapped
        if km.inferred and km.kernels:
            notes.append(f"compile {cid} {part}: torch recorded no kernel -> node mapping; kernels' nodes inferred")
        if km.graph is not None:
            stages.append(_kernels_stage(len(stages), part, km.graph, s_post, km, _seconds(c, "code_gen", i)))
            _comm_order(stages[-1], post, km.kernels, comms.scheduler_notes(c, i))
    for label, art, b in aot.values():  # a part torch traced but never compiled (a backward never run)
        add(label, _parse(art, f"{gid} {label}", notes), b or top, _seconds(c, "partition"))
    restart = any(k.attempt > c.attempt and (k.frame_id, k.frame_compile_id) == (c.frame_id, c.frame_compile_id)
                  for k in trace_compiles) if trace_compiles and not codes else False
    if not codes and (inductor or restart):
        notes.append(f"compile {cid}: torch wrote no output code" + (
            " (Dynamo restarted the frame: the next attempt compiled it)" if restart else ""))
    ig.pipeline.stages = stages
    ig.pipeline.notes = [n for n in notes if n.startswith(f"compile {cid}")]
    refine(ig, torch_modules)  # other backward kernels: the modules of the parameters their ops read or make
    ig.partition = read_partition(ig.pipeline, partitioner="min-cut" if any(
        p.name == "min_cut_rematerialization_partition" for p in c.phases) else "",
        record=recorded(c, "forward", graph="aot"))
    return ig


def _post_grad(c: Compile, i: int, gid: str, part: str, post: Graph | None, base: Stage | None, add: Any,
               notes: list[str]) -> Stage | None:
    """The post-grad stage of graph ``i``; where torch logged a communication pass's graph before
    and after it (:data:`~fxviz.analyze.inside.comms.PASS_GRAPHS`), the post-grad passes before it,
    the pass, and the passes after it as stages of their own. The buckets torch's bucketing passes
    formed (they run before those) tie each bucket's collective to its members."""
    seconds = _seconds(c, "_recursive_post_grad_passes", i)
    found = comms.buckets(c, i)
    chain: list[tuple[str, Graph | None]] = []
    for label, before, after in comms.PASS_GRAPHS:
        b, a = comms.for_part(c, before, i), comms.for_part(c, after, i)
        if b and a:
            chain += [(f"post-grad passes before {label} ({part})", _parse(b[0], f"{gid} before {label}", notes)),
                      (f"{label} ({part})", _parse(a[0], f"{gid} {label}", notes))]
    if post is None:
        return None
    chain.append((f"post-grad passes ({part})" if not chain else f"post-grad passes after {label} ({part})", post))
    last = base
    for k, (name, graph) in enumerate(chain):
        if graph is None:
            continue
        links: dict[str, list[str]] = {}
        bucket_notes: list[str] = []
        if k == 0 and found and last is not None:
            links, bucket_notes = comms.bucket_links(found, last.graph, graph)
            bucket_notes += comms.bucket_text(c, i)
        stage = add(name, graph, last, seconds if k == 0 else 0.0, links or None)
        if stage is not None:
            stage.notes = bucket_notes + stage.notes
            last = stage
    return last


def _backward_note(cid: str, record: Mapping[str, str] | None, given: int, kernels: list[Any]) -> str:
    """Which source gave the backward's kernels their modules."""
    if record is None:
        return (f"compile {cid} backward: {INFERRED_MODULES} (source lines, the parameters their ops read): "
                "the trace has no record of torch's fwd_nn_module_stack (a plain TORCH_TRACE run, or a graph taken from "
                "an Inductor FX graph cache entry made without fxviz's record: TORCHINDUCTOR_FX_GRAPH_CACHE=0 records it "
                "afresh)")
    rest = sum(1 for k in kernels if k.ops) - given
    return (f"compile {cid} backward: {FROM_TORCH}"
            + (f" ({rest} kernel(s) whose nodes torch gives no module: inferred)" if rest > 0 else ""))


def _comm_order(stage: Stage, post: Graph, kernels: list[Any], recorded: list[str]) -> None:
    """The kernels stage's collectives and waits that run elsewhere in the output code than the
    post-grad graph has them (the scheduler's reordering), and torch's records of its passes."""
    place = {n: i for i, n in enumerate(op_nodes(post))}
    label: dict[str, str] = {}
    at: dict[str, tuple[float, float]] = {}
    comm: set[str] = set()
    for k in kernels:
        spots = [place[o] for o in k.ops if o in place]
        if not k.calls or not spots:
            continue
        node = next((n.name for n in stage.graph.nodes if n.attrs.get("kernel") == k.id), None)
        if node is None:
            continue
        label[node], at[node] = k.id, (min(spots), max(spots))
        if k.kind == "collective":
            comm.add(node)
    order = [n.name for n in stage.graph.nodes if n.name in at]
    shifted, notes = comms.moved(at, order, comm, label)
    stage.moved = shifted
    stage.notes = notes + recorded


def _kernels_stage(index: int, part: str, graph: Graph, post: Stage, km: Any, seconds: float) -> Stage:
    """The kernels stage: each kernel node stands for the post-grad nodes it runs."""
    kind = INFERRED if km.inferred else EXACT
    links = {n.name: [(o, kind) for o in n.attrs.get("ops", ())] for n in graph.nodes if n.kind == "op"}
    ops = op_nodes(post.graph)
    kernels = [n.name for n in graph.nodes if n.kind == "op"]
    after: dict[str, int] = {}
    for n in graph.nodes:
        if n.kind == "op":
            after[n.target] = after.get(n.target, 0) + 1
    return Stage(index, f"kernels ({part})", graph, seconds, kind="inductor", ops_before=dict(post.ops_after),
                 ops_after=after, added=[k for k in kernels if not links.get(k)],
                 removed=list(ops), replaced=[k for k in kernels if links.get(k)], links=links, changed=True,
                 base=None if post.index == index - 1 else post.index)


#: The AOT graph each post-grad part comes from: its placeholders say which are parameters (and of
#: which module), which tells apart the nodes of one source line run by several modules (a layer's
#: ``self.layer_norm1(x)`` in every layer) in every part, not the backward's alone.
_AOT_OF = {"backward": "AOT backward", "forward": "AOT forward", "inference": "AOT inference graph"}


def _stage_graph(stages: list[Stage], name: str) -> Graph | None:
    return next((s.graph for s in stages if s.name == name), None)


def _module(dyn: str, eager_ops: Mapping[str, str], eager: Graph | None, dynamo: Graph) -> str | None:
    """The module path of Dynamo node ``dyn`` (``""``: the model itself): its eager op's, else the
    module that owns a parameter or buffer it reads, by the state-dict name the trace's reader took
    from Dynamo's argument (``L_self_modules_embeddings_modules_LayerNorm_parameters_weight_`` ->
    ``embeddings.LayerNorm``; not its local name, which Dynamo writes in snake case:
    ``l_self_modules_embeddings_modules_layer_norm_...``); ``None`` when neither says."""
    if eager is not None and dyn in eager_ops and eager_ops[dyn] in eager:
        return eager.node(eager_ops[dyn]).module
    if dyn not in dynamo:  # not in the Dynamo graph (one fxviz could not read)
        return None
    for r in dynamo.node(dyn).inputs:
        src = dynamo.node(r.node) if r.node in dynamo else None
        if src is not None and src.kind in ("parameter", "buffer"):
            return src.target.rpartition(".")[0]
    return None


def _set_origin(graph: Graph, to_dynamo: Mapping[str, Any], eager_ops: Mapping[str, str], eager: Graph | None,
                dynamo: Graph, *, inferred: bool = False, resolved: Mapping[str, list[str]] | None = None) -> None:
    """Give each op node of a stage the eager op(s) it comes from (attribute ``eager``) and, where
    there is an eager graph, that op's module stack (so the stage's tree groups by module).
    ``resolved``: nodes whose eager op is known otherwise (:func:`~fxviz.analyze.inside.comms.resolve`)."""
    for n in graph.nodes:
        if n.kind != "op":
            continue
        pre = list(to_dynamo.get(n.name, ()) if not isinstance(to_dynamo.get(n.name), str) else [to_dynamo[n.name]])
        if not pre:
            continue
        names = list((resolved or {}).get(n.name, ())) or list(
            dict.fromkeys(eager_ops.get(d, "") for d in pre if eager_ops.get(d)))
        if names:
            n.attrs["eager"] = ", ".join(names) + (" (inferred)" if inferred else "")
            if eager is not None and names[0] in eager and not n.stack:
                n.stack = eager.node(names[0]).stack
        mod = _module(pre[0], eager_ops, eager, dynamo)
        if mod and "module" not in n.attrs and eager is None:
            n.attrs["module"] = mod


__all__ = ["build"]
