"""Which ops did not fuse and why: Inductor's own fusion refusals on the kernel map. No torch.

torch does not put fusion decisions in its structured trace; its scheduler logs them on the
``fusion`` artifact logger, a refusal as ``cannot fuse op0 with op1: REASON``, a fusion as
``fusing op0 with op1``. In a live run :func:`fxviz.torchbridge.tracelog.structured_trace` turns
each into a :data:`~fxviz.tracefile.records.FUSION_LOG` artifact of its compile id, a refusal
carrying the post-grad nodes and buffers of both scheduler nodes; :func:`refusals` keeps the
refusals whose two sides torch did not fuse in a later round anyway, and :func:`not_fused` puts each
side on the kernel that writes its buffers (the output code's calls), else on those that run its
nodes (the kernel map's provenance), with their eager ops and modules. A saved trace
has no such artifact: its map has no reasons.

On CPU one C++ kernel function may run several loop nests that were not fused (Inductor's C++
backend writes consecutive scheduler nodes into one function): both sides of a refusal can then
name the same kernel, their loops apart and the intermediate buffer written to memory between them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fxviz.analyze.inside.result import Cost, Kernel, NotFused
from fxviz.tracefile.records import FUSION_LOG, Compile, Trace

#: The note of a map read from a saved trace.
NOT_IN_TRACE = ("why ops did not fuse is not in a saved trace (torch logs fusion decisions on its 'fusion' "
                "logger, not in the structured trace): a live run (fxviz compile --inside) lists them")


def listening(trace: Trace) -> bool:
    """Whether the events include fxviz's record of the fusion logger (a live run that listened)."""
    return any(a.name == FUSION_LOG for a in trace.globals)


def decisions(c: Compile, part: str) -> list[dict[str, Any]]:
    """The fusion decisions torch logged while scheduling ``part`` of compile ``c``, in its order."""
    return [a.payload for a in c.all(FUSION_LOG) if isinstance(a.payload, dict) and a.payload.get("part") == part]


def refusals(decs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The refusals among ``decs`` whose operations torch's later fusions did not bring together."""
    group: dict[str, str] = {}

    def find(x: str) -> str:
        while group.get(x, x) != x:
            x = group[x]
        return x

    for d in decs:
        if d.get("decision") == "fused":
            names = [str(n) for n in (*d.get("first_names", ()), *d.get("second_names", ()))]
            for n in names[1:]:
                a, b = find(names[0]), find(n)
                if a != b:
                    group[b] = a
    out = []
    for d in decs:
        if d.get("decision") != "refused":
            continue
        roots = {find(str(n)) for n in (*d.get("first_names", ()), *d.get("second_names", ()))}
        if len(roots) != 1:
            out.append(d)
    return out


def not_fused(recs: Sequence[dict[str, Any]], kernels: Sequence[Kernel], writers: Mapping[str, str], *, graph_id: str,
              compile_id: str, part: str, origin: Callable[[str], tuple[list[str], list[str]]]) -> list[NotFused]:
    """Each refusal of ``recs`` (:func:`refusals`) on the ``kernels`` of its output code (see
    :class:`NotFused`); ``writers``: buffer -> the kernel that writes it; ``origin(post node)`` ->
    (eager ops, module paths).

    A side's kernels are those that write its buffers; where none does (a buffer Inductor removed,
    fusing it further), those that run its post-grad nodes. Its post-grad nodes are the ones its own
    kernels run (an operation's origins include nodes inlined into it, which other kernels run)."""
    runs: dict[str, set[str]] = {k.id: set(k.ops) for k in kernels}
    owner: dict[str, list[str]] = {}
    for k in kernels:
        for n in k.ops:
            owner.setdefault(n, []).append(k.id)

    def side(ops: list[str], buffers: list[str]) -> tuple[list[str], list[str]]:
        mine = list(dict.fromkeys(writers[b] for b in buffers if b in writers))
        if not mine:
            return ops, list(dict.fromkeys(k for n in ops for k in owner.get(n, ())))
        own = [n for n in ops if any(n in runs.get(k, ()) for k in mine)]
        return own or ops, mine

    out: list[NotFused] = []
    for r in recs:
        first_ops, first_k = side([str(n) for n in r.get("first_ops") or ()],
                                  [str(b) for b in r.get("first_buffers") or ()])
        second_ops, second_k = side([str(n) for n in r.get("second_ops") or ()],
                                    [str(b) for b in r.get("second_buffers") or ()])
        origins = [origin(n) for n in (*first_ops, *second_ops)]
        eager = list(dict.fromkeys(e for ops, _ in origins for e in ops))
        modules = list(dict.fromkeys(m for _, mods in origins for m in mods))
        out.append(NotFused(graph_id, compile_id, part, str(r.get("first", "")), str(r.get("second", "")),
                            str(r.get("reason", "")), first_ops, second_ops, first_k, second_k, eager, modules))
    return out


def cache_note(cost: Cost | None, index: int, compile_id: str, part: str) -> str | None:
    """The note for output code ``index`` of a live run that logged no fusion decision for it, when
    Inductor's FX graph cache served it (the scheduler did not run); None otherwise."""
    outcomes = (cost.cache.get("fx_graph_cache") if cost is not None else None) or []
    if index < len(outcomes) and outcomes[index] == "hit":
        return (f"compile {compile_id} {part}: Inductor's FX graph cache served this graph, so its scheduler did not "
                "run and logged no fusion decisions (TORCHINDUCTOR_FX_GRAPH_CACHE=0 compiles it afresh)")
    return None


__all__ = ["NOT_IN_TRACE", "cache_note", "decisions", "listening", "not_fused", "refusals"]
