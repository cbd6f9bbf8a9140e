"""The ``comm`` overlay: collective bytes per module, and the step's totals per mesh dimension. No torch.

Collectives a capture recorded (:mod:`fxviz.fallback.comms`) live, as plain JSON, in
``graph.annotations["collectives"]``: one dict per collective with ``kind`` (``all_reduce``,
``all_gather``, ``reduce_scatter``, ``all_to_all``, ``broadcast``, ``send``, ``recv``), ``op``,
``group`` (the process group's name), ``group_size`` (its ranks), ``mesh_dim`` (the name of the
device mesh dimension the group belongs to, ``dp``/``tp``; empty when it belongs to no named one), ``bytes`` (per rank), ``module`` (its path), ``phase``
(``forward``, or ``backward`` for one run by the autograd engine, its final callbacks included),
``autograd_node`` (the backward op running it: class and sequence number) and ``source``; a
``send`` or ``recv`` also its ``peer`` (the other rank, global; -1 for a receive from any source) and
its ``bytes`` are those it receives.
:func:`write_comm` gives each backward collective a node of its own in the module of the backward
op that ran it, turns them into the ``comm`` overlay (own bytes per module call; boxes sum what is
inside) and adds the step's totals per mesh dimension (per group where unnamed; how many of them the
backward ran) to ``graph.notes`` and ``graph.annotations["comm_totals"]``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from fxviz.ir import Graph, Node, Ref
from fxviz.passes.overlays import set_overlay
from fxviz.passes.tree import tree_of

#: point-to-point kinds: one rank's send is another's recv, so ranks' sequences of them differ by design
_P2P = ("send", "recv")
#: kinds whose size is each rank's own: an all-to-all's split sizes (a MoE's dispatch of its tokens)
_OWN_SIZE = ("all_to_all",)


def collectives(graph: Graph) -> list[dict[str, Any]]:
    found = graph.annotations.get("collectives")
    return found if isinstance(found, list) else []


def _base(op: str) -> str:
    """``c10d_functional.all_reduce``, ``_c10d_functional::all_reduce_`` -> ``all_reduce``."""
    return op.replace("::", ".").rpartition(".")[2].rstrip("_")


def _link_nodes(graph: Graph, records: list[dict[str, Any]]) -> None:
    """Name, in each forward record the eager tracer did not link (a graph another method made),
    the graph's op node of that collective where it has one (``node``): the n-th collective of an
    op is the n-th node of that op, in execution order."""
    linked = {r["node"] for r in records if r.get("node")}
    nodes: dict[str, list[str]] = {}
    for n in graph.nodes:
        if n.kind == "op" and "c10d" in n.target and n.phase == "forward" and n.name not in linked:
            nodes.setdefault(_base(n.target), []).append(n.name)
    seen: Counter[str] = Counter()
    for r in records:
        if r.get("phase") == "backward" or r.get("node"):
            continue
        base = _base(str(r.get("op", "")))
        k = seen[base]
        seen[base] += 1
        found = nodes.get(base, [])
        if k < len(found):
            r["node"] = found[k]


def _forward_line(op: Node, nodes: dict[str, Node]) -> str:
    """The user's line of the forward op a backward op differentiates, or, for one whose forward
    the tracer did not see (DTensor's redistributions), of the op that made its value's shard
    (``made_by``: the redistribution's last op, on the line torch's anomaly record names), else of
    the forward op that read its output (the backward op that hands it its gradient)."""
    for n in (op, *(nodes.get(r.node) for r in op.inputs)):
        fwd = nodes.get(str(n.attrs.get("forward") or n.attrs.get("made_by", ""))) if n is not None else None
        if fwd is not None and fwd.source is not None:
            return f"{fwd.source.file}:{fwd.source.line}"
    return ""


def _place_backward(graph: Graph, records: list[dict[str, Any]]) -> bool:
    """Give each backward collective a node of its own, in the module call of the backward op
    (autograd node) it ran in: the module whose forward caused it. ``autograd_node`` (class and
    sequence number) names that op; a collective run in an op's hooks (FSDP2's pre-backward
    all-gather) belongs to that op, one run after the last op (the engine's final callbacks:
    FSDP2's reduce-scatter for a block whose inputs need no gradient) to the last op run, one in a
    hook on a parameter's gradient (``grad_of``: a hand-written data-parallel all-reduce) to the
    parameter's module, after the op that made the gradient. The node sits right after that op
    (``attrs["during"]`` names it) and reads nothing, but for FSDP2's reduce-scatter (``grads_of``):
    it reads the gradients of its unit's parameters, and is in that unit (the module holding them;
    ``CommDebugMode`` names the last module whose backward began), and for FSDP2's re-gather of a
    unit that resharded after its forward (``gathers_of``): it reads the shards of the parameters
    it gathers, which ``attrs["gathers_of"]`` names, and gives those parameters again, and the
    backward ops after it read them there (:func:`_read_regathered`). It is in the unit whose
    backward began (:func:`_in_unit`), as ``CommDebugMode`` counts it (FSDP2 prefetches the next
    unit's there). Returns whether it added any."""
    ops = [n for n in graph.nodes if n.kind == "op" and n.phase == "backward" and "seq_nr" in n.attrs]
    by_key = {(n.target, n.attrs["seq_nr"]): n for n in ops}
    if not ops:
        return False
    nodes = {n.name: n for n in graph.nodes}
    used = set(nodes)
    params = {n.target: n for n in graph.nodes if n.kind == "parameter"}
    unsharded = {n.target: n for n in graph.nodes if n.kind == "parameter" and "shard_of" not in n.attrs}
    grads = {str(n.attrs["grad_of"]): n for n in graph.nodes if n.kind == "output" and "grad_of" in n.attrs}
    shards: dict[str, Node] = {}  # FSDP2's shard of each parameter, by the parameter's name (its first)
    for n in graph.nodes:
        if n.kind == "parameter" and "shard_of" in n.attrs:
            shards.setdefault(str(n.attrs["shard_of"]), n)
    after: dict[str, list[Node]] = {}
    pos = {n.name: i for i, n in enumerate(graph.nodes)} if any(r.get("grads_of") for r in records) else {}
    for r in records:
        if r.get("phase") != "backward":
            continue
        at = r.get("autograd_node")
        during = by_key.get((at[0], at[1])) if isinstance(at, list) and len(at) == 2 else ops[-1]
        owner = during
        if during is None and r.get("grad_of"):  # a hook on a parameter's gradient: in the parameter's
            owner = params.get(str(r["grad_of"]))  # module, after the op that made the gradient
            made = grads.get(str(r["grad_of"]))
            during = nodes.get(made.inputs[-1].node) if made is not None and made.inputs else None
        if during is None or owner is None:  # an autograd node outside the graph's backward (a nested one)
            continue
        name, i = f"{_base(str(r.get('op', '')))}_bw", 1
        while name in used:
            name, i = f"{_base(str(r.get('op', '')))}_bw_{i}", i + 1
        used.add(name)
        stack, reads = owner.stack, _grads_read(r, grads, during, pos) if pos else ()
        attrs = {"during": during.name, "collective": r.get("kind", ""), "bytes": int(r.get("bytes", 0))}
        regathered: tuple[Any, ...] = ()
        if r.get("gathers_of"):  # FSDP2's re-gather: it reads the unit's shards, as its forward all-gather
            reads = tuple(Ref(shards[g].name) for g in r["gathers_of"] if g in shards)
            attrs["gathers_of"] = list(r["gathers_of"])
            if all(g in unsharded and unsharded[g].outputs for g in r["gathers_of"]):
                regathered = tuple(unsharded[g].outputs[0] for g in r["gathers_of"])
            stack = _in_unit(stack, r, records)
        if reads and r.get("grads_of"):  # FSDP2's reduce-scatter: in its unit, the module holding the parameters it reduces
            unit = _common_path([str(g).rpartition(".")[0] for g in r["grads_of"]])
            stack = tuple(c for c in during.stack if not c[0] or unit == c[0] or unit.startswith(c[0] + "."))
        node = Node(name, "op", target=str(r.get("op", "")), inputs=reads, stack=stack, outputs=regathered,
                    phase="backward", attrs=attrs)
        after.setdefault(during.name, []).append(node)
        r["module"], r["node"] = node.module, name
        if not r.get("source"):
            r["source"] = _forward_line(during, nodes)
    if after:
        graph.nodes[:] = [m for n in graph.nodes for m in (n, *after.get(n.name, ()))]
        _read_regathered(graph, unsharded)
    return bool(after)


def _read_regathered(graph: Graph, params: dict[str, Node]) -> None:
    """FSDP2's re-gather of a unit that resharded after its forward gives the unit's unsharded
    parameters again (its outputs, in ``gathers_of``'s order: the collective and the copy-out of the
    gathered bytes into the parameters, which the backward records as one): the forward freed
    their storage, so every op of the backward that reads one of them after the re-gather reads
    what the re-gather wrote, not the forward's value, and reads it there. ``params``: the
    unsharded parameter nodes by name."""
    now: dict[str, Ref] = {}  # parameter node -> the re-gather output that holds its value now
    for n in graph.nodes:
        if n.phase == "forward":
            continue
        if now and n.kind == "op":
            n.inputs = tuple(now.get(r.node, r) if r.index == 0 else r for r in n.inputs)
        gathered = n.attrs.get("gathers_of") if n.kind == "op" and n.outputs else None
        for k, g in enumerate(gathered or ()):
            now[params[g].name] = Ref(n.name, k)


def _in_unit(stack: tuple[tuple[str, int], ...], r: dict[str, Any], records: list[dict[str, Any]]) -> tuple[tuple[str, int], ...]:
    """The call, of ``stack``'s, of the innermost FSDP2 unit (a module whose forward all-gathered on
    ``r``'s group) it is in: FSDP2 gathers in a unit's pre-backward hook, which runs as the unit's
    backward begins, before its first backward op (in a submodule: ``1.down``), and prefetches the
    next unit's there too; ``CommDebugMode`` counts both in the unit whose backward began."""
    units = {f.get("module", "") for f in records
             if f.get("phase") != "backward" and f.get("kind") == "all_gather" and f.get("group") == r.get("group")}
    at = max((k for k, (path, _) in enumerate(stack) if path in units), default=None)
    if at is None:
        return stack if "" not in units else ()
    return stack[:at + 1]


def _grads_read(r: dict[str, Any], grads: dict[str, Node], during: Node, pos: dict[str, int]) -> tuple[Ref, ...]:
    """What a backward collective that reduces parameters' gradients (``grads_of``: FSDP2's
    reduce-scatter of a unit's) reads: the values the graph's gradient outputs of those parameters
    read, made before it runs (``pos``: each node's place in the graph)."""
    at = pos[during.name]
    return tuple(ref for g in r.get("grads_of", ()) if g in grads for ref in grads[g].inputs if pos[ref.node] <= at)


def _common_path(paths: list[str]) -> str:
    """The innermost module path that holds all of ``paths`` (``""``: the model)."""
    parts = [p.split(".") if p else [] for p in paths]
    common: list[str] = []
    for names in zip(*parts, strict=False):
        if len(set(names)) != 1:
            break
        common.append(names[0])
    return ".".join(common)


def write_comm(graph: Graph, records: Sequence[dict[str, Any]]) -> None:
    """Store ``records`` on ``graph``, with the ``comm`` overlay and per-group totals in the notes.
    The call tree is the one the capture's passes built (:func:`~fxviz.passes.tree.sharing` around
    both), unless backward collectives added nodes."""
    records = [dict(r) for r in records]
    _link_nodes(graph, records)
    added = _place_backward(graph, records)
    graph.annotations["collectives"] = records
    unfilled = _unfilled_reads(graph, records)
    graph.notes += [unfilled] if unfilled else []
    tree = graph.calls if added else tree_of(graph)
    # a module's total: its own collectives and those of its submodules; the model's always, so a
    # sharded capture that moved nothing (a mesh dimension of one rank) has the overlay, at 0 bytes
    total: Counter[str] = Counter({"": 0})
    for r in records:
        parts = r.get("module", "").split(".") if r.get("module") else []
        for k in range(len(parts) + 1):
            total[".".join(parts[:k])] += int(r.get("bytes", 0))
    modules: dict[str, int] = {}
    for path, b in total.items():
        calls = tree.calls(path) if path else [tree.root]
        if calls:
            modules[calls[0].id] = b
    nodes: Counter[str] = Counter()  # a node's own: an op on DTensors may run several
    for r in records:
        if r.get("node"):
            nodes[r["node"]] += int(r.get("bytes", 0))
            node = graph.node(r["node"]) if r.get("phase") != "backward" and r["node"] in graph else None
            if node is not None:  # what ran in the call: the collective itself, or DTensor's redistributions
                node.attrs.setdefault("collectives", []).append(r.get("kind", ""))
    set_overlay(graph, "comm", label="comm", kind="number", unit="B", nodes=dict(nodes), modules=modules, reduce="sum",
                description="bytes each rank sends in collectives (a recv: receives): per collective op, and per "
                            "module with its submodules (graph.annotations['collectives'] lists each one)")
    per_dim: Counter[tuple[str, str, int]] = Counter()
    count: Counter[tuple[str, str, int]] = Counter()
    backward: Counter[tuple[str, str, int]] = Counter()
    for r in records:
        key = (str(r.get("mesh_dim", "")), str(r.get("group", "")), int(r.get("group_size", 0)))
        per_dim[key] += int(r.get("bytes", 0))
        count[key] += 1
        backward[key] += r.get("phase") == "backward"
    totals = []
    for dim, g, size in sorted(per_dim):
        key = (dim, g, size)
        totals.append({"mesh_dim": dim, "group": g, "group_size": size, "count": count[key], "bytes": per_dim[key],
                       "backward": backward[key]})
        where = f"mesh dimension {dim} (group {g or '?'}, {size or '?'} ranks)" if dim else \
            f"group {g or '?'} ({size or '?'} ranks)"
        phases = f" ({count[key] - backward[key]} forward, {backward[key]} backward)" if backward[key] else ""
        graph.notes.append(f"collectives on {where}: {count[key]}{phases}, {per_dim[key]:,} bytes per rank")
    graph.annotations["comm_totals"] = totals


def _unfilled_reads(graph: Graph, records: list[dict[str, Any]]) -> str | None:
    """A note where the model read in Python (``.item()``: a data-dependent node) a value computed
    from what a receive under the fake process group was given (``unfilled``: the fake group writes
    nothing into it, so it holds what the buffer held): what the model did with it is not what a
    real run, where a peer sends it, must do. A pipeline schedule's warm-up vote is one: stage 0
    reads a 0 there, and runs its shape inference (a forward, the sends of its metadata) even where
    every stage was given its shapes and a real run skips it."""
    tainted = {r["node"] for r in records if r.get("unfilled") and r.get("node")}
    if not tainted:
        return None
    reads = []
    for n in graph.nodes:
        if n.name not in tainted and any(ref.node in tainted for ref in n.inputs):
            tainted.add(n.name)
            if n.attrs.get("data_dependent"):
                reads.append(n)
    if not reads:
        return None
    first = reads[0]
    value = f" = {first.meta.value}" if first.meta is not None and first.meta.value is not None else ""
    where = f" at {first.source.file.rpartition('/')[2]}:{first.source.line}" if first.source is not None else ""
    return (f"the fake process group delivers nothing to a receive, and the model read {len(reads)} received "
            f"value{'s' if len(reads) > 1 else ''} in Python ({first.name}{value}{where}): what it did next is what "
            "that value makes it do, not necessarily what a real run does (a pipeline schedule's warm-up vote: 0, "
            "so stage 0 infers its shapes); under torchrun, every rank a process, the peers send")


def _say(r: dict[str, Any] | None) -> str:
    if r is None:
        return "nothing"
    where = r.get("module") or "the model"
    return f"{r.get('kind', '?')} ({int(r.get('bytes', 0)):,} B, {r.get('phase', 'forward')}, {where})"


def rank_mismatches(graphs: Sequence[Graph]) -> list[dict[str, Any]]:
    """Flag the collectives that differ between ranks, given one graph per rank (``graphs[0]`` is
    the one shown; a graph's rank is ``annotations["rank"]``, else its position).

    Every rank of a group must issue that group's collectives in the same order, with the same
    kind and size (but an all-to-all, whose split sizes are each rank's own); the first one where a rank differs (another kind or size, or none at all) is
    where the ranks part and wait on each other (the classic hang). Collectives are aligned per
    mesh dimension (per process group where unnamed), in the order each rank issued them, forward
    then backward; after the first difference a group's sequences are out of step, so one flag per
    group. Sends and recvs pair ranks rather than match across them: each rank's sends to a peer
    must be, in order and size, that peer's receives from it (:func:`_p2p_flags`). Each flag is a
    dict (``group``, ``index``, ``ranks``: rank -> what it issued there), kept in
    ``graphs[0].annotations["rank_mismatches"]``, with a note, the record marked
    (``rank_mismatch``) and its node's ``attrs["rank_mismatch"]`` where it has one."""
    if not graphs:
        return []

    def per_group(g: Graph) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for r in collectives(g):
            if r.get("kind") not in _P2P:  # a send and its recv are on two ranks by design
                out.setdefault(str(r.get("mesh_dim") or r.get("group", "")), []).append(r)
        return out

    ranks = [g.annotations.get("rank", i) for i, g in enumerate(graphs)]
    seqs = [per_group(g) for g in graphs]
    ref, flags = graphs[0], []
    for key in sorted({k for s in seqs for k in s}):
        lists = [s.get(key, []) for s in seqs]
        for i in range(max(len(x) for x in lists)):
            got = [x[i] if i < len(x) else None for x in lists]
            sig = {(r.get("kind"), None if r.get("kind") in _OWN_SIZE else r.get("bytes")) if r is not None else None
                   for r in got}
            if len(sig) == 1:
                continue
            said = {str(rank): _say(r) for rank, r in zip(ranks, got, strict=True)}
            flags.append({"group": key, "index": i, "ranks": said})
            text = f"collective {i + 1} on {key or 'the default group'} differs between ranks: " + \
                ", ".join(f"rank {k} {v}" for k, v in said.items())
            _mark(ref, got[0], text, "each waits for a collective another never issues (a hang)")
            break
    flags += _p2p_flags(graphs, ranks)
    ref.annotations["rank_mismatches"] = flags
    return flags


def _mark(ref: Graph, mine: dict[str, Any] | None, text: str, why: str) -> None:
    """Say ``text`` in the shown graph's notes and mark its record (and node) where it has one."""
    ref.notes.append(f"{text}: {why}")
    if mine is not None:
        mine["rank_mismatch"] = text
        if mine.get("node") and any(n.name == mine["node"] for n in ref.nodes):
            ref.node(mine["node"]).attrs["rank_mismatch"] = text


def _p2p_flags(graphs: Sequence[Graph], ranks: list[Any]) -> list[dict[str, Any]]:
    """The first send/recv pair per channel (sender -> receiver, both among ``graphs``) where the
    sender's n-th send to the receiver is not, in size, the receiver's n-th receive from it, or one
    of them is missing: a receive of another size fills its buffer with what was not meant for it
    (gloo does not check) and one without its send waits forever. A rank that receives from any
    source (``peer`` -1) could have taken any send: what is sent to it is not paired."""
    index = {int(r): k for k, r in enumerate(ranks)}
    chans: dict[tuple[int, int], tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {}
    anyone = set()  # ranks that receive from any source: which send each took is unknown
    for rank, g in zip(ranks, graphs, strict=True):
        for r in collectives(g):
            peer = int(r.get("peer", -1))
            if r.get("kind") == "recv" and peer < 0:
                anyone.add(int(rank))
            if r.get("kind") not in _P2P or peer < 0 or peer not in index:
                continue
            sending = r["kind"] == "send"
            key = (int(rank), peer) if sending else (peer, int(rank))
            chans.setdefault(key, ([], []))[0 if sending else 1].append(r)
    flags: list[dict[str, Any]] = []
    for (src, dst), (sends, recvs) in sorted(chans.items()):
        for i in [] if dst in anyone else range(max(len(sends), len(recvs))):
            s = sends[i] if i < len(sends) else None
            got = recvs[i] if i < len(recvs) else None
            if s is not None and got is not None and s.get("bytes") == got.get("bytes"):
                continue
            said = {str(src): _say(s), str(dst): _say(got)}
            flags.append({"group": f"send {src}->{dst}", "index": i, "ranks": said})
            text = f"send {i + 1} from rank {src} to rank {dst} does not match its receive: " + \
                f"rank {src} {said[str(src)]}, rank {dst} {said[str(dst)]}"
            why = "the receiver waits for a message never sent (a hang)" if s is None else \
                "a message nobody receives (a hang)" if got is None else \
                "the receive's buffer is not the size of what is sent"
            shown = int(ranks[0])
            _mark(graphs[0], s if shown == src else got if shown == dst else None, text, why)
            break
    return flags


def compare_ranks(graphs: Sequence[Graph | None]) -> None:
    """A launch's graphs, one per rank in rank order (``None``: a rank that gave none), compared
    into ``graphs[0]`` (the one shown): :func:`rank_mismatches` on those there are, and a note that
    says what agreed, or which ranks could not be compared."""
    ref = graphs[0]
    if ref is None:
        return
    there = [g for g in graphs if g is not None]
    flags = rank_mismatches(there)
    missing = [str(r) for r, g in enumerate(graphs) if g is None]
    if missing:
        ref.notes.append(f"rank 0 of {len(graphs)} (torchrun): rank{'s' if len(missing) > 1 else ''} "
                         f"{', '.join(missing)} gave no graph (failed before capturing, or had not finished when rank 0 "
                         "stopped waiting for it): not compared")
    elif not flags:
        ref.notes.append(_agreement(there))


def _agreement(graphs: Sequence[Graph]) -> str:
    """What :func:`rank_mismatches` compared, for a launch where it flagged nothing."""
    mine = collectives(graphs[0]) if graphs else []
    n = sum(r.get("kind") not in _P2P for r in mine)
    sends = sum(r.get("kind") == "send" for g in graphs for r in collectives(g))
    own = " (an all-to-all's size is each rank's own)" if any(r.get("kind") in _OWN_SIZE for r in mine) else ""
    said = [f"every rank issued the same {n} collective{'s' if n != 1 else ''}, in the same order, kind and size{own}"
            ] if n or not sends else []
    if sends:
        said.append(f"each of the ranks' {sends} send{'s' if sends != 1 else ''} met its receive, in order and size")
    return f"rank 0 of {len(graphs)} (torchrun): " + "; ".join(said)


__all__ = ["collectives", "compare_ranks", "rank_mismatches", "write_comm"]
