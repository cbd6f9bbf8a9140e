"""The kernel map of one output code: every kernel and extern call Inductor generated, with the
post-grad nodes it runs. No torch.

The nodes come from torch: ``cppCodeToPost`` of ``inductor_provenance_tracking_node_mappings``
(kernel handle -> post-grad nodes). Where torch recorded none (the backward's mapping is empty in
torch 2.13; a plain ``TORCH_TRACE`` run, which leaves provenance tracking off, records none at all)
they are inferred and marked so: an extern call (``extern_kernels.addmm``, an ATen fallback
``torch.ops.aten...``) takes the node of its own op its ``Topologically Sorted Source Nodes`` comment
names, else the next one of its op in graph order; a generated kernel takes each remaining
computing node in the first kernel that runs after every extern call the node depends on, unless
the output code's buffers say which kernel computes it (a graph output is the buffer ``call()``
returns, made by the first call that names it), never one that runs before such an extern call.

A post-grad node no kernel runs is listed with the reason: a view (Inductor reinterprets its
input's buffer), a ``getitem`` (part of its producer's kernel), or none recorded.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fxviz.analyze.inside.comms import comm_name, group_of
from fxviz.analyze.inside.result import Kernel
from fxviz.analyze.inside.stages import op_nodes
from fxviz.ir import Graph, ModuleCall, Node, Ref
from fxviz.tracefile.code import ONE_OP, OutputCode
from fxviz.tracefile.fxtext import TORCH_NAMESPACES

#: ATen ops that Inductor runs as views of a buffer (``reinterpret_tensor``), never as a kernel.
VIEW_OPS = frozenset({
    "view", "reshape", "permute", "t", "transpose", "expand", "unsqueeze", "squeeze", "slice", "select", "as_strided",
    "alias", "_unsafe_view", "view_as", "unflatten", "flatten", "detach", "_reshape_alias", "squeeze_copy", "split",
    "split_with_sizes", "unbind", "narrow", "diagonal", "chunk", "lift_fresh", "clone_view", "_to_copy_view",
})


def short(target: str) -> str:
    """``aten.addmm.default`` / ``torch.ops.aten.addmm.default`` -> ``addmm``; a custom op or a
    collective as the post-grad graph names it, ``transformers::grouped_mm_fallback.default``, and as
    the output code calls it, ``torch.ops.transformers.grouped_mm_fallback.default``, ->
    ``transformers::grouped_mm_fallback``."""
    if target.startswith("torch.ops."):
        ns, _, rest = target[len("torch.ops."):].partition(".")
        if ns not in TORCH_NAMESPACES and rest:
            target = f"{ns}::{rest}"
    parts = [p for p in target.split(".") if p not in ("torch", "ops", "aten", "prims", "default", "Tensor", "Scalar")]
    return parts[0] if parts else target


def is_view(n: Node) -> bool:
    return short(n.target) in VIEW_OPS


def is_getitem(n: Node) -> bool:
    return short(n.target) == "getitem" or n.target.endswith("getitem")


@dataclass
class KernelMap:
    """One output code's kernels, the kernels stage's graph, and what no kernel runs; ``writers``:
    each buffer of the output code (``buf3``) -> the kernel (id) that writes it (:func:`writers`)."""

    kernels: list[Kernel] = field(default_factory=list)
    writers: dict[str, str] = field(default_factory=dict)
    graph: Graph | None = None
    unmapped: dict[str, str] = field(default_factory=dict)
    ops: int = 0
    mapped: int = 0
    inferred: bool = False


def kernel_map(post: Graph, code: OutputCode, mappings: Mapping[str, Any] | None, stacks: Mapping[str, Any] | None, *,
               graph_id: str, compile_id: str, part: str,
               origin: Callable[[str], tuple[list[str], list[str]]]) -> KernelMap:
    """The kernel map of ``code`` (whose post-grad graph is ``post``). ``origin(post node)`` ->
    (eager ops, module paths) it comes from."""
    ops = op_nodes(post)
    recorded = dict((mappings or {}).get("cppCodeToPost") or {})
    calls = list(code.calls)
    handles = [c.handle or f"{c.name}:{i + 1}" for i, c in enumerate(calls)]
    frames = {h: _frames(stacks, h) for h in handles}
    inferred = not recorded
    covers = ({h: [n for n in recorded.get(h, ()) if n in ops] for h in handles} if recorded
              else _infer(post, code, handles, frames))
    fixed = _misrecorded(ops, calls, handles, covers) if recorded else set()
    defs = {k.name: k for k in code.kernels}
    out = KernelMap(inferred=inferred, writers={b: handles[i] for b, i in writers(code).items()})
    called = set()
    for c, h in zip(calls, handles, strict=True):
        called.add(c.name)
        eager: list[str] = []
        modules: list[str] = []
        for n in covers.get(h, ()):
            e, m = origin(n)
            eager += [x for x in e if x not in eager]
            modules += [x for x in m if x not in modules]
        kdef = defs.get(c.name)
        kind = c.kind if c.kind != "other" or kdef is None else kdef.kind
        out.kernels.append(Kernel(h, c.name, kind, graph_id, compile_id, part, list(covers.get(h, ())), eager, modules,
                                  _lines(frames[h]), kdef.source if kdef is not None else "", inferred or h in fixed,
                                  group=group_of(ops, covers.get(h, ())) if kind == "collective" else ""))
    for k in code.kernels:  # defined, never called: still a row
        if k.name not in called:
            out.kernels.append(Kernel(k.name, k.name, k.kind, graph_id, compile_id, part, source=k.source, calls=0))
    covered = {n for k in out.kernels for n in k.ops}
    for name, n in ops.items():
        if name in covered:
            continue
        if is_view(n):
            out.unmapped[f"{part}:{name}"] = "view: no kernel, Inductor reinterprets its input's buffer"
        elif is_getitem(n):
            out.unmapped[f"{part}:{name}"] = "getitem: an output of its producer's kernel"
        else:
            users = any(r.node == name for m in post.nodes for r in m.inputs)
            out.unmapped[f"{part}:{name}"] = ("no kernel recorded by torch" if users else
                                              "no kernel: its value is never used (Inductor dropped it)")
    computing = [n for n in ops.values() if not is_view(n) and not is_getitem(n)]
    out.ops = len(computing)
    out.mapped = sum(1 for n in computing if n.name in covered)
    out.graph = kernels_graph(post, out.kernels)
    return out


def _misrecorded(ops: Mapping[str, Node], calls: list[Any], handles: list[str], covers: dict[str, list[str]]) -> set[str]:
    """Extern and collective calls torch's ``cppCodeToPost`` gives nodes none of which is the
    call's op (the ``addmm`` whose output an in-place collective then reduces is recorded as the
    collective's ``wait_tensor``, a ``reduce_scatter_tensor`` as its wait), all of them nodes that
    another call runs too: each takes instead the first node of its op that no call covers (a
    collective recorded as its wait: the collective that wait awaits, whose input copy a fused
    kernel runs too), marked inferred. Returns their handles."""
    covered = {n for ns in covers.values() for n in ns}
    fixed: set[str] = set()
    for c, h in zip(calls, handles, strict=True):
        if c.kind not in ONE_OP or not covers.get(h):
            continue
        name = comm_name if c.kind == "collective" else short
        op = comm_name(c.name) if c.kind == "collective" else c.name.rsplit(".", 1)[-1]
        if any(name(ops[n].target) == op for n in covers[h]) or \
                not all(any(n in covers[o] for o in handles if o != h) for n in covers[h]):
            continue  # its own op's node, or a node no other call runs: torch's record stands
        own = next((n for n, node in ops.items() if name(node.target) == op and n not in covered), None)
        if own is None and c.kind == "collective":  # recorded as its wait: the collective that wait awaits
            own = next((r.node for n in covers[h] for r in ops[n].inputs
                        if r.node in ops and name(ops[r.node].target) == op), None)
        if own is not None:
            covers[h] = [own]
            covered.add(own)
            fixed.add(h)
    return fixed


_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def _frames(stacks: Mapping[str, Any] | None, handle: str) -> list[list[tuple[str, int]]]:
    """Each stack torch's kernel stack traces record for ``handle``, as its frames (file name,
    line), outermost first."""
    return [[(f.rsplit("/", 1)[-1], int(ln)) for f, ln in _FRAME.findall(str(text))]
            for text in (stacks or {}).get(handle, ()) or ()]


def _lines(frames: list[list[tuple[str, int]]]) -> list[str]:
    """``gen.py:7`` for each frame of a call's stacks, first seen first."""
    return list(dict.fromkeys(f"{f}:{ln}" for stack in frames for f, ln in stack))


def writers(code: OutputCode) -> dict[str, int]:
    """Buffer or input name -> the index of the first call that names it (passes or assigns it):
    the call that writes a buffer (Inductor allocates it, then hands it to its kernel)."""
    first: dict[str, int] = {}
    for i, c in enumerate(code.calls):
        for buf in (*c.args, *c.results):
            first.setdefault(buf, i)
    return first


def _pins(post: Graph, code: OutputCode) -> dict[str, int]:
    """Post-grad node -> the call that computes it, from the buffers of the output code: a
    buffer belongs to the first call that names it (passes or assigns it); the graph's outputs are
    the buffers ``call()`` returns, in order (:attr:`OutputCode.returns`)."""
    ops = op_nodes(post)

    def base(name: str) -> str:
        return _through_views(name, ops)

    first = writers(code)
    pins: dict[str, int] = {}
    out = next((n for n in post.nodes if n.kind == "output"), None)
    if out is not None:
        for r, buf in zip(out.inputs, code.returns, strict=False):
            if buf in first:
                pins.setdefault(base(r.node), first[buf])
    # a node reading a graph input that one fused call alone is passed (a layer's saved forward
    # value: Inductor reuses one kernel for identical layers, each call passed its layer's values)
    readers: dict[str, set[int]] = {}
    for i, c in enumerate(code.calls):
        for a in c.args if c.kind not in ONE_OP else ():
            readers.setdefault(a, set()).add(i)
    inputs = {n.name for n in post.nodes if n.kind in ("input", "parameter", "buffer")}
    for name, node in ops.items():
        if name in pins or is_view(node) or is_getitem(node):
            continue
        at = {i for r in node.inputs if (b := base(r.node)) in inputs for i in readers.get(b, ())}
        if len(at) == 1:
            pins[name] = next(iter(at))
    return pins


def _infer(post: Graph, code: OutputCode, handles: list[str],
           frames: Mapping[str, list[list[tuple[str, int]]]] | None = None) -> dict[str, list[str]]:
    """Post-grad nodes per call where torch recorded none (see the module's docstring)."""
    ops = op_nodes(post)
    calls = code.calls
    pins = _pins(post, code)
    order = list(ops)
    taken: set[str] = set()
    covers: dict[str, list[str]] = {h: [] for h in handles}
    extern_at: dict[str, int] = {}
    for i, (c, h) in enumerate(zip(calls, handles, strict=True)):
        if c.kind not in ONE_OP:
            continue
        # the comment names the source nodes of the call and of the views and kernels before it
        # (``[embedding, linear]`` above an addmm that reads an embedding's buffer): its own op first,
        # named there or the next of that op in graph order, then any of the comment's ATen ops
        named = [n for n in c.source_nodes if n in ops and n not in taken and not is_view(ops[n])]
        op = short(c.name.removeprefix("extern_kernels."))
        want = ({op} | {a.rsplit(".", 1)[-1] for a in c.aten}) - VIEW_OPS
        free = [n for n in order if n not in taken]
        named = ([n for n in named if short(ops[n].target) == op]
                 or next(([n] for n in free if short(ops[n].target) == op), [])
                 or [n for n in named if short(ops[n].target) in want]
                 or next(([n] for n in free if short(ops[n].target) in want), []) or named)
        for x in named[:1]:
            covers[h].append(x)
            taken.add(x)
            extern_at[x] = i
    fused = [i for i, c in enumerate(calls) if c.kind not in ONE_OP]
    after: dict[str, int] = {}  # node -> the last extern call (index) it depends on, -1 for none
    for name, node in ops.items():
        deps = [after.get(r.node, -1) for r in node.inputs if r.node in ops]
        deps += [extern_at[r.node] for r in node.inputs if r.node in extern_at]
        after[name] = max(deps, default=-1)
    # torch's kernel stack traces (recorded for the backward too) say which source lines each call
    # runs: a node goes to a call that runs its line
    runs = {i: {stack[-1] for stack in (frames or {}).get(handles[i], ()) if stack} for i in fused}
    placed: dict[str, int] = {}
    for name, node in ops.items():
        if name in taken or is_view(node) or is_getitem(node) or not fused:
            continue
        at = (node.source.file.rsplit("/", 1)[-1], node.source.line) if node.source is not None else None
        able = [k for k in fused if at in runs[k]] or fused
        # pinned by a buffer, else where all the values it reads were computed (a recomputed
        # layer's chain follows the saved value it starts from), else the first call after its inputs;
        # never a call that runs before an extern call whose value it reads (a residual add reads
        # both the kernel before an addmm and the addmm)
        fed = {placed[b] for r in node.inputs if (b := _through_views(r.node, ops)) in placed}
        pinned = pins.get(name, next(iter(fed)) if len(fed) == 1 else None)
        ready = [k for k in able if k > after[name]]
        i = pinned if pinned in ready else (ready[0] if ready else able[-1])
        covers[handles[i]].append(name)
        placed[name] = i
    _feeders(code, ops, handles, covers, fused, {n.name for n in post.nodes if n.kind in ("input", "parameter", "buffer")})
    return covers


def _feeders(code: OutputCode, ops: Mapping[str, Node], handles: list[str], covers: dict[str, list[str]],
             fused: list[int], inputs: set[str]) -> None:
    """A generated kernel left with no node that only prepares a later call's inputs (CLIP's
    ``cpp_fused_convolution_0`` copies the image and the weight into the layout the
    ``extern_kernels.convolution`` after it reads): it takes the nodes of the calls that read the
    buffers it writes whose op its name names (Inductor names a kernel after its origins' ops),
    as torch's provenance record does (``cppCodeToPost``: ``cpp_fused_convolution_0:1``:
    ``["convolution"]``)."""
    first = writers(code)
    for i in fused:
        if covers[handles[i]]:
            continue
        named = f"_{code.calls[i].name}_"
        made = {b for b in code.calls[i].args if first.get(b) == i and b not in inputs}
        for j in range(i + 1, len(code.calls)):
            if made & set(code.calls[j].args):
                covers[handles[i]] += [n for n in covers[handles[j]] if n in ops and f"_{short(ops[n].target)}_" in named
                                       and n not in covers[handles[i]]]


def _through_views(name: str, ops: Mapping[str, Node]) -> str:
    """The node whose value ``name`` views (itself when it is no view or getitem)."""
    while name in ops and (is_view(ops[name]) or is_getitem(ops[name])) and ops[name].inputs:
        name = ops[name].inputs[0].node
    return name


def kernels_graph(post: Graph, kernels: list[Kernel]) -> Graph:
    """The kernels stage: the post-grad graph's inputs and outputs, one op node per kernel call (its
    target the kernel's name, reading the kernels and inputs its nodes read), in call order."""
    ops = op_nodes(post)
    owner = {n: k.id for k in kernels for n in k.ops}
    nodes: list[Node] = []
    for n in post.nodes:
        if n.kind != "op" and n.kind != "output":
            nodes.append(n)

    def source_of(name: str, seen: set[str]) -> list[str]:
        """The kernels or graph inputs behind ``name`` (through views and getitems)."""
        if name in owner:
            return [owner[name]]
        if name not in ops or name in seen:
            return [name] if name not in ops else []
        seen.add(name)
        return [s for r in ops[name].inputs for s in source_of(r.node, seen)]

    names = {k.id: _node_name(k.id) for k in kernels}
    for k in kernels:
        if not k.calls:
            continue
        reads = list(dict.fromkeys(s for n in k.ops for r in ops[n].inputs for s in source_of(r.node, set())
                                   if s != k.id))
        last = ops[k.ops[-1]] if k.ops else None
        first = ops[k.ops[0]] if k.ops else None
        stack: tuple[ModuleCall, ...] = first.stack if first is not None else ()
        nodes.append(Node(names[k.id], "op", k.name, tuple(Ref(names.get(s, s)) for s in reads), stack,
                          last.outputs if last is not None else (), first.source if first is not None else None,
                          {"kernel": k.id, "kind": k.kind, "ops": list(k.ops)}))
    for n in post.nodes:
        if n.kind == "output":
            ins = tuple(Ref(names.get(s, s)) for r in n.inputs for s in source_of(r.node, set()))
            nodes.append(Node(n.name, "output", n.target, tuple(dict.fromkeys(ins)), n.stack, n.outputs, n.source,
                              dict(n.attrs)))
    seen: set[str] = set()
    for n in nodes:  # keep reads of what came before: not a constant folded away, nor a kernel that
        # runs later (torch's node lists can put a node in a kernel before one it reads)
        n.inputs = tuple(r for r in n.inputs if r.node in seen)
        seen.add(n.name)
    g = Graph(name=post.name, nodes=nodes, method="inductor kernels", modules=dict(post.modules))
    return g


def _node_name(handle: str) -> str:
    """``extern_kernels.addmm:1`` -> ``extern_kernels_addmm_1``: a node name."""
    return "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in handle)


__all__ = ["VIEW_OPS", "KernelMap", "is_getitem", "is_view", "kernel_map", "kernels_graph", "short", "writers"]
