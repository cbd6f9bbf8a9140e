"""``plumbing``: which ops are export's plumbing rather than the model's computation. No torch.

A captured graph holds ops nobody would draw on a whiteboard: the causal mask built from
``arange``, ``unsqueeze`` ×3 and ``le``, position ids, arithmetic on symbolic sizes, export's
``_assert_tensor_metadata`` checks, ``alias`` and ``detach``, the wrappers around ``no_grad``
blocks. They fill the first view of a transformer. This pass classifies them, by data flow rather
than by name alone, and writes the result as the category overlay ``plumbing`` (node name ->
category, :data:`CATEGORIES`); renderers fold each module call's plumbing into one box or line,
one click away, never deleted.

The rules, in order (an op matches the first that applies):

1. Never plumbing: an op of a computing family (``linear``, ``matmul``, ``conv``, ``attention``,
   ``norm``, ``activation``, ``pool``, ``reduction``, ``embedding``, a custom op), a data-dependent
   exit (``item``, ``__bool__``), a random op, the op that raised.
2. By name: export's checks (``assert``), ``alias``/``lift_fresh`` and conversions that change
   nothing (``alias``), ``detach`` (``detach``), the wrappers of higher-order ops whose bodies the
   graph shows, and their ``getitem`` (``wrapper``).
3. Data-free values: an op whose inputs are only sizes (``sym_size``, ``new_ones`` read nothing but
   metadata), constants, integer or boolean buffers and other data-free values, with nothing from
   the model's inputs or float parameters. It is plumbing when its value is an integer or boolean
   (positions, masks, indices), a size (``shape``), a float made only by creating and reshaping
   (a constant), a float derived from a boolean (a mask turned into ``-inf``/``0``), or a float
   that ends up an integer or boolean (T5's relative-position buckets). A data-free float that
   flows into the computation as a float (a sinusoidal position table) is computation.
4. Masks from the user's inputs: an op that combines integer or boolean model inputs (an
   ``attention_mask``) with data-free values, into a boolean or into ops that are all plumbing
   themselves. ``input_ids`` reshaped for an embedding stays computation: its reader is not
   plumbing.

Categories name what the plumbing is for: ``mask`` (boolean, or feeding a boolean), ``position``
(integer tensors: positions and indices), ``shape`` (sizes), ``constant``, ``assert``, ``alias``,
``detach``, ``wrapper``.
"""

from __future__ import annotations

from functools import lru_cache

from fxviz.calls import STATE_KINDS
from fxviz.ir import Graph, Node
from fxviz.ops import ASSERTS, DATA_DEPENDENT, RANDOM, op_family, op_name, short_name
from fxviz.passes.overlays import set_overlay

#: Plumbing categories, in words (the overlay's category labels).
CATEGORIES: dict[str, str] = {
    "mask": "mask construction",
    "position": "positions and indices",
    "shape": "size arithmetic",
    "constant": "constant tensors",
    "assert": "export's checks",
    "alias": "aliases and no-op conversions",
    "detach": "detach",
    "wrapper": "wrappers export adds",
}

#: Families whose ops compute: never plumbing, whatever they read.
COMPUTE_FAMILIES = frozenset({
    "conv", "linear", "matmul", "attention", "norm", "activation", "pool", "reduction", "embedding",
    "data-dependent", "custom",
})
#: Families whose ops may be plumbing when what they read allows it.
_MOVERS = frozenset({"shape", "indexing", "creation", "elementwise"})
#: Ops that read only a tensor's metadata (size, dtype, device), never its values.
METADATA_ONLY = frozenset({
    "sym_size", "sym_numel", "sym_stride", "sym_storage_offset", "size", "dim", "numel", "new_ones",
    "new_zeros", "new_empty", "new_full", "zeros_like", "ones_like", "empty_like", "full_like",
    "_assert_tensor_metadata",
})
#: Other ops that create or move values without computing (``op_family`` calls them ``other``).
_MORE_MOVERS = frozenset({
    "scalar_tensor", "lift_fresh", "lift_fresh_copy", "_to_copy", "fill", "full", "empty", "zeros", "ones",
    "empty_strided", "new_ones", "new_zeros", "new_empty", "new_full", "sym_size", "sym_numel", "sym_stride",
    "sym_float", "sym_int", "sym_max", "sym_min", "sym_not", "sym_ite", "sym_sum", "floordiv", "mod",
    "truediv", "floor", "ceil", "getitem", "masked_fill", "triu", "tril", "logical_and", "logical_or",
})
#: Ops whose result is a mask even when they make floats (``-inf`` above the diagonal).
_MASK_MAKERS = frozenset({"triu", "tril", "masked_fill", "where"})
_ALIASES = frozenset({"alias", "lift_fresh"})
_CONVERSIONS = frozenset({"to", "_to_copy", "type_as", "type"})
_DETACHES = frozenset({"detach", "detach_"})
#: Higher-order ops and global-state switches export wraps regions in.
_WRAPPERS = ("wrap_with_set_grad_enabled", "wrap_with_autocast", "_set_grad_enabled", "_enter_autocast",
             "_exit_autocast", "set_grad_enabled")


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat", "complex"))


def _tensor_dtypes(n: Node) -> list[str]:
    return [m.dtype for m in n.outputs if m.is_tensor]


def _identity_conversion(n: Node, graph: Graph) -> bool:
    """``x.to(x.dtype)``: a conversion whose output has the metadata of its input."""
    if not n.inputs or len(n.outputs) != 1:
        return False
    src = graph.meta_of(n.inputs[0])
    out = n.outputs[0]
    return src is not None and src.is_tensor and (src.shape, src.dtype) == (out.shape, out.dtype) and (
        not src.device or not out.device or src.device == out.device)


Facts = tuple[str, str, bool, str | None, str | None, bool]


@lru_cache(maxsize=8192)
def _facts(target: str) -> Facts:
    """What an op's target alone decides, once per target (a model repeats a few targets many
    times): its short name, its family, whether it is never plumbing (data-dependent or random),
    its category by name (rule 2: ``assert``, ``alias``, ``detach``), whether export wraps
    regions in it (``wrapper``, or ``hop`` for a higher-order op that wraps a body), and whether
    rule 2 may apply at all (most ops: no call of :func:`_by_name`)."""
    name, short, family = op_name(target), short_name(target), op_family(target)
    if family == "reduction" and target.endswith(".other"):
        family = "elementwise"  # torch.min(a, b), torch.max(a, b): element by element
    skip = short in DATA_DEPENDENT or name in DATA_DEPENDENT or short in RANDOM
    named = ("assert" if name in ASSERTS or short in ASSERTS else "alias" if short in _ALIASES
             else "detach" if short in _DETACHES or name == "detach" else None)
    wrapper = ("hop" if "higher_order" in target else "wrapper") if any(w in target for w in _WRAPPERS) else None
    by_name = named is not None or wrapper is not None or short in _CONVERSIONS or short == "getitem"
    return short, family, skip, named, wrapper, by_name


def _by_name(n: Node, facts: Facts, graph: Graph, inlined: bool, wrappers: set[str]) -> str | None:
    """Rule 2: the category of an op that is plumbing whatever it reads, or ``None`` (always
    ``None`` where ``facts`` say rule 2 cannot apply)."""
    short, _, _, named, wrapper, _ = facts
    if named is not None:
        return named
    if short in _CONVERSIONS and _identity_conversion(n, graph):
        return "alias"
    if wrapper is not None:
        if wrapper == "wrapper" or inlined:
            wrappers.add(n.name)
            return "wrapper"
        return None  # the op stands for a body the graph does not show: it is the computation
    if short == "getitem" and n.inputs and all(r.node in wrappers for r in n.inputs):
        return "wrapper"
    return None


def classify_plumbing(graph: Graph) -> dict[str, str]:
    """Node name -> plumbing category, for the plumbing ops of ``graph`` (the rules above)."""
    inlined: bool | None = None  # an op wraps a region (read on the first op rule 2 may name)
    dtypes_of: dict[int, tuple[list[str], bool]] = {}  # by id of a lone output's metadata: shared
    free: set[str] = set()  # data-free values (rule 3), of nodes of any kind
    masky: set[str] = set()  # values made from a boolean, or a mask maker's
    user_int: set[str] = set()  # integer or boolean model inputs (rule 4)
    pure: set[str] = set()  # data-free values made without float arithmetic
    wrappers: set[str] = set()
    candidates: dict[str, str] = {}  # op -> "free" or "user": which rule may make it plumbing
    fixed: dict[str, str] = {}  # op -> category by name (rule 2)
    for n in graph.nodes:
        kind = n.kind
        if kind in STATE_KINDS or kind == "input":
            outs = n.outputs
            if kind == "parameter" and len(outs) == 1 and outs[0].is_tensor:
                continue  # a tensor parameter is data (most state: its dtype is not looked at)
            known = dtypes_of.get(id(outs[0])) if len(outs) == 1 else None
            if known is None:
                dtypes = _tensor_dtypes(n)
                known = (dtypes, any(map(_is_float, dtypes)))
                if len(outs) == 1:
                    dtypes_of[id(outs[0])] = known
            dtypes, floats = known
            # constants a capture lifts, integer or boolean buffers: part of the model, not data;
            # a scalar input (a flag, a size) is data-free too
            if kind == "constant" or not dtypes or (kind == "buffer" and not floats):
                free.add(n.name)
                pure.add(n.name)
            elif kind == "input" and not floats:
                user_int.add(n.name)
            continue
        if kind != "op" or n.error is not None or n.attrs.get("data_dependent"):
            continue
        facts = _facts(n.target)
        short, family, skip, _, _, by_name = facts
        if skip:
            continue
        named = None
        if by_name:
            if inlined is None:
                inlined = any("region" in m.attrs for m in graph.nodes)
            named = _by_name(n, facts, graph, inlined, wrappers)
        if named is not None:
            fixed[n.name] = named
            if named in ("alias", "detach") and n.inputs:  # the same value, under another name
                for found in (free, pure, masky, user_int):
                    if n.inputs[0].node in found:
                        found.add(n.name)
            continue
        if family in COMPUTE_FAMILIES:  # most ops: decided before their outputs are looked at
            continue
        outs = n.outputs
        if len(outs) == 1:  # tensor dtypes, once per metadata object (read only)
            known = dtypes_of.get(id(outs[0]))
            if known is None:
                dtypes = _tensor_dtypes(n)
                known = dtypes_of[id(outs[0])] = (dtypes, any(map(_is_float, dtypes)))
            dtypes = known[0]
        else:
            dtypes = _tensor_dtypes(n)
        scalar_only = bool(n.outputs) and not dtypes
        if not (scalar_only or family in _MOVERS or short in _MORE_MOVERS or short in METADATA_ONLY):
            continue
        inputs = n.inputs
        if inputs and short not in METADATA_ONLY and (first := inputs[0].node) not in free and first not in user_int:
            continue  # read from the computation: neither rule below can take it (most ops)
        reads = [r.node for r in inputs]
        if short in METADATA_ONLY or all(r in free for r in reads):
            free.add(n.name)
            candidates[n.name] = "free"
            inputs_pure = all(r in pure for r in reads) or short in METADATA_ONLY
            if inputs_pure and (not any(map(_is_float, dtypes)) or family in ("creation", "shape", "indexing")
                                or short in _MORE_MOVERS):
                pure.add(n.name)
        elif all(r in free or r in user_int for r in reads) and (
                not any(map(_is_float, dtypes)) or any(r in masky for r in reads)):
            user_int.add(n.name)
            candidates[n.name] = "user"
        else:
            continue
        if short in _MASK_MAKERS or "bool" in dtypes or any(r in masky for r in reads):
            masky.add(n.name)

    if not candidates:  # nothing for the rules that read the readers (most eager captures)
        return {n.name: fixed[n.name] for n in graph.nodes if n.name in fixed} if fixed else {}
    users = graph.users()
    out: dict[str, str] = dict(fixed)
    # backwards, so that every reader is decided before what it reads
    feeds_index: set[str] = set()  # data-free values that end up as an integer or boolean
    for n in reversed(graph.nodes):
        rule = candidates.get(n.name)
        if rule is None:
            continue
        dtypes = _tensor_dtypes(n)
        floats = any(map(_is_float, dtypes))
        readers = users[n.name]
        plumbing_readers = [u for u in readers if u in out]
        if rule == "free":
            if any(u in candidates and candidates[u] == "free" and (u in feeds_index or not any(
                    map(_is_float, _tensor_dtypes(graph.node(u))))) for u in readers):
                feeds_index.add(n.name)
            if floats and not (n.name in pure or n.name in masky or n.name in feeds_index):
                continue  # a data-free float the model computes with (rule 3)
        elif not (n.name in masky or (readers and len(plumbing_readers) == len(readers))):
            continue  # a user's integer input on its way into the computation (rule 4)
        # a value that only feeds masks is part of the mask; one that also feeds other plumbing is not
        feeds_mask = bool(plumbing_readers) and all(out.get(u) == "mask" for u in plumbing_readers)
        if not dtypes and n.outputs:
            out[n.name] = "shape"
        elif "bool" in dtypes or feeds_mask or (floats and n.name in masky):
            out[n.name] = "mask"
        elif not floats or n.name in feeds_index:
            out[n.name] = "position"
        else:
            out[n.name] = "constant"
    return {n.name: out[n.name] for n in graph.nodes if n.name in out}


def mark_plumbing(graph: Graph) -> Graph:
    """Write the category overlay ``plumbing`` (see :func:`classify_plumbing`)."""
    nodes = classify_plumbing(graph)
    set_overlay(
        graph, "plumbing", label="plumbing", kind="category", nodes=nodes,
        categories={k: {"label": words} for k, words in CATEGORIES.items() if k in set(nodes.values())},
        description="ops that build masks, positions and sizes, export's checks, aliases, detaches and "
                    "wrappers: folded into one box per module call",
    )
    return graph


def plumbing_of(graph: Graph) -> dict[str, str]:
    """Node name -> plumbing category, as the ``plumbing`` pass wrote it (empty when it did not run)."""
    spec = graph.annotations.get("overlays", {}).get("plumbing")
    nodes = spec.get("nodes") if isinstance(spec, dict) else None
    return nodes if isinstance(nodes, dict) else {}


def plumbing_summary(names: list[str], plumbing: dict[str, str]) -> str:
    """``12 plumbing ops (mask, shape)``: how many of ``names`` are plumbing and for what, the most
    frequent category first."""
    counts: dict[str, int] = {}
    for name in names:
        cat = plumbing.get(name)
        if cat is not None:
            counts[cat] = counts.get(cat, 0) + 1
    total = sum(counts.values())
    cats = ", ".join(sorted(counts, key=lambda c: -counts[c]))
    return f"{total} plumbing op{'s' if total != 1 else ''} ({cats})" if total else ""


__all__ = ["CATEGORIES", "COMPUTE_FAMILIES", "METADATA_ONLY", "classify_plumbing", "mark_plumbing", "plumbing_of",
           "plumbing_summary"]
