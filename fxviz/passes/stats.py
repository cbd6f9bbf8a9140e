"""``stats``: parameter and op counts per module, and op counts for the whole graph.

Writes ``graph.annotations["stats"]``::

    {"total_params": 1234, "total_ops": 56, "op_counts": {"linear": 12, ...},
     "modules": {"h.0": {"params": 7087872, "ops": 31}, ...}}

Both counts include the module's descendants in the attribute hierarchy (``h.0`` counts
``h.0.attn``). A parameter shared by two modules (tied weights) counts once, for the module that
owns its name.
"""

from __future__ import annotations

from collections import Counter

from fxviz.ir import Graph
from fxviz.ops import short_name
from fxviz.passes.tree import calls_of


def compute_stats(graph: Graph) -> Graph:
    # own counts per module first, then each module adds its own to every enclosing module once:
    # modules are far fewer than nodes
    # plain dicts, in the order a Counter would fill them (a Counter's missing key is a Python call)
    own_params: dict[str, int] = {}
    numels: dict[int, int] = {}  # by id: a capture shares one metadata object per shape
    # ops counted per target, then named once per target (a model repeats a few targets many
    # times); short names keep the order of their first op, as when counted op by op
    targets: dict[str, int] = {}
    for n in graph.nodes:
        kind = n.kind
        if kind == "op":
            target = n.target
            targets[target] = targets.get(target, 0) + 1
        elif kind == "parameter" and "tied_to" not in n.attrs and "shard_of" not in n.attrs:  # FSDP2: counted unsharded
            path = n.stack[-1][0] if n.stack else ""
            if n.outputs:
                m = n.outputs[0]
                numel = numels.get(id(m))
                if numel is None:
                    numel = numels[id(m)] = m.numel or 0
            else:
                numel = 0
            own_params[path] = own_params.get(path, 0) + numel
    own_ops: dict[str, int] = {}
    for call in calls_of(graph):
        path = call.stack[-1][0] if call.stack else ""
        own_ops[path] = own_ops.get(path, 0) + len(call.ops)
    ops: Counter[str] = Counter()
    for target, count in targets.items():
        ops[short_name(target)] += count

    # every module counted and every module around one, in order of first mention (outer first);
    # then each adds its total to its parent's, last added first (a module is added after its
    # parent, so it is counted whole before its parent reads it): linear in the modules, where
    # adding each count to every prefix of its path cost the cube of the nesting depth
    totals: dict[str, list[int]] = {"": [0, 0]}
    for k, counter in enumerate((own_params, own_ops)):
        for path, count in counter.items():
            t = totals.get(path)
            if t is None:
                new = []
                p = path
                while p not in totals:
                    new.append(p)
                    p = p.rpartition(".")[0]
                for q in reversed(new):
                    totals[q] = [0, 0]
                t = totals[path]
            t[k] += count
    for path, t in reversed(totals.items()):
        if path:
            parent = totals[path.rpartition(".")[0]]
            parent[0] += t[0]
            parent[1] += t[1]
    mods = {p: {"params": t[0], "ops": t[1]} for p, t in totals.items()}
    graph.annotations["stats"] = {
        "total_params": sum(own_params.values()),
        "total_ops": sum(ops.values()),
        "op_counts": dict(ops.most_common()),
        "modules": mods,
    }
    return graph
