"""What each compiled graph's op counts count. No torch.

torch's ``graph_op_count`` (its compilation metrics, what tlparse shows) counts every call node of
Dynamo's graph (``count_calls``). The map counts the ops of the eager graph that ran inside a graph.
The two differ by the Dynamo ops no eager op is (:func:`no_eager_op`), of three kinds:

- ``unpack``: a ``getitem`` taking one output of a call that returned several (``q, k, v =
  x.split(...)``: the eager tracer records the split; Python unpacks its tuple, Dynamo records each
  ``getitem``; GPT-2: 3 per layer);
- ``no tensor``: a call whose value holds no tensor (``torch._C._log_api_usage_once``, which
  ``nn.Module.__init__`` calls when the forward builds a module, as ``ModuleList[:n]`` does in the
  LLaMA family; ``_set_grad_enabled``; size arithmetic);
- the rest: tensor ops of Dynamo's graph that match no op of the eager forward. The forward took
  another path under torch.compile (transformers builds the attention mask itself when compiling,
  where the eager forward lets SDPA apply causality), so these ran compiled and are not in the eager
  graph; a note says where.

And the other way, eager ops in a graph that are no Dynamo op: the ones Dynamo folded away
(:mod:`.match`'s fill: ``x.size(0)``, eval-mode dropout).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from fxviz.analyze.compilemap.match import Run
from fxviz.analyze.compilemap.result import CompiledGraph

#: words for :attr:`~fxviz.analyze.compilemap.records.OpRecord.kind`
KINDS = {"unpack": "unpacks a tuple", "no tensor": "no tensor", "": "no eager op"}

#: how the map's count and torch's differ, for the panel note and the terminal
OPS_COUNTED = ("fxviz counts the eager forward's ops that ran inside a graph; torch's graph_op_count counts "
               "every call node of Dynamo's graph, a getitem that unpacks a tuple and a call computing no tensor "
               "(_log_api_usage_once) included")


def no_eager_op(graphs: Sequence[CompiledGraph], runs: Sequence[Run], rows: Sequence[Sequence[int | None]],
                claimed: Collection[tuple[int, int]], assigned: dict[str, str]) -> str:
    """Set each graph's ``eager_ops`` (the eager ops in it) and ``no_eager_op`` (its Dynamo ops no
    eager op is, from its first run on the first input set: ``"getitem (unpacks a tuple)
    modeling_gpt2.py:187"``); return a note on the tensor ops among them (they ran only compiled),
    ``""`` where none."""
    held: dict[str, int] = {}
    for gid in assigned.values():
        held[gid] = held.get(gid, 0) + 1
    first: dict[str, int] = {}
    for k, (gid, _) in enumerate(runs):
        first.setdefault(gid, k)
    only: list[str] = []
    for g in graphs:
        r = first.get(g.id)
        if r is None:  # compiled for a later input set: the eager graph is the first's
            continue
        g.eager_ops = held.get(g.id, 0)
        g.no_eager_op = []
        for j, (d, i) in enumerate(zip(runs[r][1], rows[r], strict=True)):
            if i is not None or (r, j) in claimed:
                continue
            kind = getattr(d, "kind", "")
            at = f"{d.file.rsplit('/', 1)[-1]}:{d.line}" if d.line else ""
            g.no_eager_op.append(f"{d.name} ({KINDS.get(kind, kind)})" + (f" {at}" if at else ""))
            if not kind:
                only.append(at or d.name)
    if not only:
        return ""
    where = ", ".join(dict.fromkeys(only))
    return (f"{len(only)} op{'s' * (len(only) != 1)} of Dynamo's graphs match no op of the eager forward (at {where}): "
            "the forward takes another path when compiling, so they ran compiled and are not in the eager graph; "
            "torch's graph_op_count counts them, the share compiled does not")


def op_count_lines(graphs: Sequence[CompiledGraph], *, limit: int = 10) -> list[str]:
    """The terminal's line of op counts: per graph, the eager ops in it and torch's
    ``graph_op_count``, and what Dynamo's graph holds that no eager op is; none where they agree."""
    shown = [g for g in graphs if g.eager_ops is not None]
    if not shown or all(g.eager_ops == g.ops and not g.no_eager_op for g in shown):
        return []
    parts = []
    for g in shown[:limit]:
        theirs = g.torch_op_count if g.torch_op_count is not None else g.ops
        parts.append(f"{g.id} {g.eager_ops} (torch {theirs})")
    more = f", ... {len(shown) - limit} more graphs" if len(shown) > limit else ""
    out = [f"eager ops per graph: {', '.join(parts)}{more} ({OPS_COUNTED})"]
    for g in shown[:limit]:
        if g.no_eager_op:
            counts: dict[str, int] = {}
            for text in g.no_eager_op:
                counts[text] = counts.get(text, 0) + 1
            listed = ", ".join(f"{t} x{k}" if k > 1 else t for t, k in list(counts.items())[:limit])
            more = f", ... {len(counts) - limit} more" if len(counts) > limit else ""
            out.append(f"  {g.id}: in torch's count, no eager op: {listed}{more}")
    return out


__all__ = ["KINDS", "OPS_COUNTED", "no_eager_op", "op_count_lines"]
