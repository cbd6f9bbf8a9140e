"""What Inductor's communication passes did to a compiled graph's collectives, from torch's own
records. No torch.

torch 2.13 records, per graph it compiles (the forward, then the backward):

- the FX bucketing passes of the post-grad passes (``bucket_all_gathers_fx``,
  ``bucket_reduce_scatters_fx``): the artifacts ``fx_bucketing_passes_all_gather_buckets`` /
  ``fx_bucketing_passes_reduce_scatter_buckets``, each bucket's member nodes as torch printed them
  (``[[all_gather_into_tensor, all_gather_into_tensor_1]]``: the names of the nodes before the pass,
  as in ``before_post_grad_graph`` and AOT Autograd's graph), logged before the post-grad graph
  (``fx_passes/bucketing.py``, ``merge_all_gather`` / ``merge_reduce_scatter``). The all-reduce
  bucketing (``bucket_all_reduces_fx``) logs no buckets: its new collectives show as the post-grad
  stage's added nodes, without members;
- the overlap scheduling pass (``aten_distributed_optimizations.enable_overlap_scheduling``): its
  graph before and after (``overlap_scheduling_graph_before`` / ``_after``), which become stages of
  their own (:data:`PASS_GRAPHS`);
- the scheduler's reordering (``reorder_for_compute_comm_overlap`` with
  ``reorder_for_compute_comm_overlap_passes``, ``comms.py``): a text table per pass
  (``reorder_communication_preserving_peak_memory``, ``sink_waits_iterative_info``; :data:`SCHEDULER`),
  and the collectives in the order the scheduler left them (``inductor_collective_schedule``). Where
  a collective or its wait finally runs is the output code's order: :func:`moved` compares it with
  the post-grad graph's, for the kernels stage.

A record of the FX passes belongs to the graph whose post-grad graph comes next in the trace; one
of the scheduler's (logged while scheduling, the collective schedule after the output code) to the
graph whose post-grad graph came last.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from fxviz.ir import Graph, Node
from fxviz.tracefile.records import Artifact, Compile

#: Bucket records: artifact -> the collective its buckets hold. torch logs them from
#: ``merge_all_gather`` / ``merge_reduce_scatter``, which ``bucket_all_gathers_fx`` /
#: ``bucket_reduce_scatters_fx`` call, and so does the overlap scheduling's FSDP pre-bucketing.
BUCKETS = {
    "fx_bucketing_passes_all_gather_buckets": "all_gather",
    "fx_bucketing_passes_reduce_scatter_buckets": "reduce_scatter",
}
#: Text torch logs about the post-grad passes' bucketing (one line each).
BUCKET_TEXT = ("pre_bucketing_fsdp_collectives",)
#: A communication pass whose graph torch logs before and after it: (stage name, before, after).
PASS_GRAPHS = (("overlap scheduling", "overlap_scheduling_graph_before", "overlap_scheduling_graph_after"),)
#: The scheduler's reordering passes' own summaries (text).
SCHEDULER = ("reorder_communication_preserving_peak_memory", "sink_waits_iterative_info")
#: The scheduler's final order of collectives (JSON: their kernel names).
SCHEDULE = "inductor_collective_schedule"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def is_comm(target: str) -> bool:
    """A collective or its wait (``_c10d_functional``)."""
    return "c10d_functional" in target


def comm_name(target: str) -> str:
    """``torch.ops._c10d_functional.all_reduce_.default`` / ``_c10d_functional::all_reduce`` ->
    ``all_reduce`` (the in-place and ``_out`` variants named as the op)."""
    tail = re.split(r"::|\.", target.split("c10d_functional", 1)[-1].lstrip(".:"))[0]
    tail = tail.rstrip("_")
    return tail[: -len("_out")] if tail.endswith("_out") else tail


_QUOTED = re.compile(r"'([^']*)'")


def group_of(ops: Mapping[str, Node], names: Sequence[str]) -> str:
    """The process group (torch's name for it) that the post-grad collective among ``names`` runs
    on, or that the collective a ``wait_tensor`` among them awaits: the op's last argument, as every
    ``_c10d_functional`` collective takes it (``all_reduce_(addmm_1, 'sum', '0')``); ``""`` when
    none is there."""
    for name in names:
        n = ops.get(name)
        if n is not None and is_comm(n.target) and comm_name(n.target) == "wait_tensor" and n.inputs:
            n = ops.get(n.inputs[0].node)
        if n is not None and is_comm(n.target) and comm_name(n.target) != "wait_tensor":
            found = _QUOTED.findall(str(n.attrs.get("args", "")))
            if found:
                return found[-1]
    return ""


def for_part(c: Compile, name: str, i: int, *, scheduler: bool = False) -> list[Artifact]:
    """The artifacts ``name`` of the ``i``-th graph compiled (0: the forward): those logged
    between its post-grad graph and the next one (``scheduler``: after it, the scheduler's and the
    code generation's records), else before it (the post-grad passes' records)."""
    seen = 0
    want = i + 1 if scheduler else i
    out: list[Artifact] = []
    for a in c.artifacts:
        if a.name == "inductor_post_grad_graph":
            seen += 1
        elif a.name == name and seen == want:
            out.append(a)
    return out


def buckets(c: Compile, i: int) -> list[tuple[str, str, list[str]]]:
    """The buckets torch formed in graph ``i``: (its artifact, collective, member nodes) each."""
    out: list[tuple[str, str, list[str]]] = []
    for art, kind in BUCKETS.items():
        for a in for_part(c, art, i):
            text = a.payload if isinstance(a.payload, str) else str(a.payload)
            for inner in re.findall(r"\[([^\[\]]*)\]", text):
                members = _NAME.findall(inner)
                if members:
                    out.append((art, kind, members))
    return out


def bucket_text(c: Compile, i: int) -> list[str]:
    """What else torch logged about graph ``i``'s bucketing (:data:`BUCKET_TEXT`)."""
    return [f"{art} (torch's record): {str(a.payload).strip().splitlines()[0]}"
            for art in BUCKET_TEXT for a in for_part(c, art, i) if str(a.payload or "").strip()]


def bucket_links(found: list[tuple[str, str, list[str]]], before: Graph, after: Graph
                 ) -> tuple[dict[str, list[str]], list[str]]:
    """Each bucket's collective (and its wait) in ``after`` -> its members (and their waits) in
    ``before``, and a note per bucket. The bucket's collective is the ``k``-th collective of its kind
    that ``after`` has and ``before`` has not, for the ``k``-th bucket of that kind torch logged."""
    old = {n.name: n for n in before.nodes if n.kind == "op"}
    new = [n for n in after.nodes if n.kind == "op" and n.name not in old and is_comm(n.target)]
    links: dict[str, list[str]] = {}
    notes: list[str] = []
    taken: dict[str, int] = {}
    for art, kind, members in found:
        fresh = [n for n in new if comm_name(n.target).startswith(kind)]  # all_gather_into_tensor(_out)
        k = taken.get(kind, 0)
        taken[kind] = k + 1
        known = [m for m in members if m in old]
        node = fresh[k].name if k < len(fresh) else None
        if node is not None and known:
            links[node] = known
            waits_old = [w.name for w in before.nodes if w.kind == "op" and comm_name(w.target) == "wait_tensor"
                         and any(r.node in known for r in w.inputs)]
            wait = next((w.name for w in after.nodes if w.kind == "op" and w.name not in old
                         and comm_name(w.target) == "wait_tensor" and any(r.node == node for r in w.inputs)), None)
            if wait is not None and waits_old:
                links[wait] = waits_old
        notes.append(f"bucket of {len(members)} {kind}s ({', '.join(members)})"
                     + (f" -> {node}" if node is not None else "") + f" (torch's {art})")
    return links, notes


def moved(before: Mapping[str, tuple[float, float]], after: Sequence[str], comm: set[str],
          label: Mapping[str, str] | None = None) -> tuple[list[str], list[str]]:
    """The nodes of ``comm`` whose place among the other nodes changed, and a note for each:
    ``before``: each node -> the first and last place of what it stands for in the order it is
    compared with (a kernel: its post-grad nodes); ``after``: the nodes in their new order. A
    collective or wait moved when it now runs after a node all of whose places came after it, or
    before one all of whose places came before it; ``label`` names the nodes in the notes."""
    out: list[str] = []
    notes: list[str] = []
    name = label or {}
    for i, c in enumerate(after):
        if c not in comm or c not in before:
            continue
        lo, hi = before[c]
        later = [o for o in after[:i] if o not in comm and o in before and before[o][0] > hi]
        earlier = [o for o in after[i + 1:] if o not in comm and o in before and before[o][1] < lo]
        if not later and not earlier:
            continue
        out.append(c)
        what = []
        if later:
            what.append(f"later, after {_names(later, name)}")
        if earlier:
            what.append(f"earlier, before {_names(earlier, name)}")
        notes.append(f"{name.get(c, c)} moved {' and '.join(what)}")
    return out, notes


def _names(nodes: list[str], label: Mapping[str, str]) -> str:
    shown = [label.get(n, n) for n in nodes[:4]]
    return ", ".join(shown) + (f" and {len(nodes) - 4} more" if len(nodes) > 4 else "")


def scheduler_notes(c: Compile, i: int) -> list[str]:
    """The scheduler's communication passes' own summaries for graph ``i`` (their first line, and
    the nodes each moved where torch's table says so), and its final collective order."""
    out: list[str] = []
    for art in SCHEDULER:
        for a in for_part(c, art, i, scheduler=True):
            text = a.payload if isinstance(a.payload, str) else str(a.payload)
            lines = [ln.strip() for ln in text.splitlines() if ln.strip() and "tabulate" not in ln]
            head = lines[0] if lines and not lines[0].startswith("[") else ""
            peak = [ln for ln in lines if re.search(r"peak_memory_(?:before|after):", ln)]
            out.append(f"{art} (torch's record): " + "; ".join(x for x in [head, *peak[:2]] if x))
    for a in for_part(c, SCHEDULE, i, scheduler=True):
        if isinstance(a.payload, list) and a.payload:
            out.append(f"{SCHEDULE} (torch's record): " + ", ".join(str(x) for x in a.payload))
    return out


def schedule(c: Compile, i: int) -> list[str] | None:
    """torch's ``inductor_collective_schedule`` for graph ``i``: the collective kernels in the
    order the scheduler left them (``None``: not recorded)."""
    arts = for_part(c, SCHEDULE, i, scheduler=True)
    return [str(x) for x in arts[0].payload] if arts and isinstance(arts[0].payload, list) else None


def below(dynamo: Graph, eager: Graph, eager_ops: Mapping[str, str], taken: set[str]) -> dict[str, list[str]]:
    """Dynamo op -> the eager collectives and waits it ran, for a Dynamo op the compile map's
    op-for-op pairing left without an eager op (DTensor's ``redistribute``, ``from_local``: one
    Dynamo op, under which the eager tracer recorded the collective DTensor issued, in the module
    whose hook ran it): the collectives among the eager ops no Dynamo op took between the eager ops
    of its paired neighbours (``taken``: every eager op a Dynamo op of any graph was paired with)."""
    order = [n.name for n in eager.nodes if n.kind == "op"]
    at = {n: i for i, n in enumerate(order)}
    dyn = [n.name for n in dynamo.nodes if n.kind == "op"]
    out: dict[str, list[str]] = {}
    for j, d in enumerate(dyn):
        if d in eager_ops:
            continue
        lo = next((at[eager_ops[x]] for x in reversed(dyn[:j]) if eager_ops.get(x) in at), None)
        hi = next((at[eager_ops[x]] for x in dyn[j + 1:] if eager_ops.get(x) in at), None)
        if lo is None and hi is None:
            continue
        if lo is not None:
            span = range(lo + 1, len(order) if hi is None else hi)
        else:
            span = range(hi - 1, -1, -1) if hi is not None else range(0)
        gap: list[str] = []
        for i in span:
            if order[i] in taken:
                break
            gap.append(order[i])
        if lo is None:
            gap.reverse()
        found = [e for e in gap if is_comm(eager.node(e).target)]
        if found:
            out[d] = found
    return out


def resolve(post: Graph, post_to_pre: Mapping[str, Sequence[str]], under: Mapping[str, list[str]], eager: Graph
            ) -> dict[str, list[str]]:
    """Post-grad collective or wait -> the eager ops it is, for those whose Dynamo ops are
    :func:`below`'s: for each such Dynamo op, the eager op of the same collective under it. Dynamo
    ops that share their eager ops (two ``full_tensor`` calls side by side) take them in turn, in
    the Dynamo graph's order (a bucket's collective stands for one eager collective of each)."""
    wanted: dict[tuple[str, str], None] = {}
    for n in post.nodes:
        if n.kind == "op" and is_comm(n.target):
            for d in post_to_pre.get(n.name, ()):
                if d in under:
                    wanted[(d, comm_name(n.target))] = None
    rank = {d: i for i, d in enumerate(under)}
    given: dict[tuple[str, str], str] = {}
    used: set[str] = set()
    for d, name in sorted(wanted, key=lambda k: rank[k[0]]):
        e = next((e for e in under[d] if e not in used and comm_name(eager.node(e).target) == name), None)
        if e is not None:
            given[(d, name)] = e
            used.add(e)
    out: dict[str, list[str]] = {}
    for n in post.nodes:  # in graph order: a collective before its wait
        if n.kind == "op" and is_comm(n.target):
            found = [given[k] for d in post_to_pre.get(n.name, ()) if (k := (d, comm_name(n.target))) in given]
            if not found and comm_name(n.target) == "wait_tensor":
                # no eager wait recorded (under autograd, funcol wraps the result with
                # ``_wrap_tensor_autograd`` and waits outside the forward): the wait is the
                # collective's it awaits
                found = next((out[r.node] for r in n.inputs if r.node in out), [])
            if found:
                out[n.name] = list(dict.fromkeys(found))
    return out


__all__ = ["BUCKETS", "BUCKET_TEXT", "bucket_text", "PASS_GRAPHS", "SCHEDULE", "SCHEDULER", "below", "bucket_links", "buckets", "comm_name", "group_of",
           "for_part", "is_comm", "moved", "resolve", "schedule", "scheduler_notes"]
