"""``capture(backward=True)`` through export: the joint graph of one training step (forward and
backward in one fx graph) -> IR.

The model is exported with its loss (:class:`LossModel`), and AOT Autograd's
``aot_export_joint_with_descriptors`` traces the exported module's forward and backward together.
torch records on every node what fxviz needs: ``partitioner_tag`` (``is_forward``/``is_backward``:
the node's :attr:`~fxviz.ir.Node.phase`), ``seq_nr`` (a backward op shares it with the forward op it
differentiates: kept as ``attrs["seq_nr"]``), ``fwd_nn_module_stack`` on backward ops (the module
stack of that forward op: the backward op is placed in that module call), and ``desc`` on the
graph's inputs and outputs (``ParamAOTInput``, ``TangentAOTInput``, ``GradAOTOutput``: which
placeholder is which parameter, which output is whose gradient).

Gradients of parameters are output nodes named ``grad of <parameter>`` (``attrs["grad_of"]``), in
phase ``backward``, reading the op that produced them. The saved activations (``Graph.saved``) are
read from the graph: every forward value a backward op reads (what AOT Autograd's default partition
saves), saved by the forward op of that backward op's ``seq_nr``, each storage counted once (a view
of a parameter or an input costs nothing), as eager autograd keeps it
(:mod:`fxviz.symbolic.eager_saved`: a dropout's noise instead of ``native_dropout``'s bool mask where
eager's kernel keeps that; an attention mask only the traced program may build is marked
``inferred`` with its reason). The rest adds up to what ``saved_tensors_hooks`` sees
(``tests/test_backward_json.py`` checks GPT-2 and LLaMA per record). A model that calls ``torch.utils.checkpoint`` is exported strictly, and the
regions torch tagged in its joint graph become recompute nodes, the saved records those of the
checkpointed step (:mod:`fxviz.symbolic.checkpoint`, :func:`with_recompute`).
"""

from __future__ import annotations

import contextlib
import operator
import re
from typing import Any

import torch
import torch.fx
from torch import nn

from fxviz.errors import CaptureError
from fxviz.ir import Graph, Saved
from fxviz.passes.overlays import ITEMSIZE
from fxviz.symbolic.checkpoint import (
    RECOMPUTE,
    SAVE,
    add_recompute,
    checkpoint_calls,
    one_region_per_call,
    recompute_tags,
    strict_program,
)
from fxviz.symbolic.convert import Converter, Placeholder
from fxviz.symbolic.eager_saved import as_eager
from fxviz.symbolic.fused import rnn_layers
from fxviz.torchbridge.normalize import FlatInputs, flatten_inputs
from fxviz.torchbridge.training import (
    NOTHING_TO_DIFFERENTIATE,
    Loss,
    LossError,
    check_trainable,
    returned,
    step_loss,
    unread_outputs,
)
from fxviz.torchbridge.values import mark_tied, module_infos

PREFIX = "model"
CALLS = "fxviz_checkpoint_calls"  # the joint graph's meta: how many checkpoint calls the forward made
CALLERS = "fxviz_checkpoint_callers"  # the joint graph's meta: the module path that made each checkpoint call
UNREAD = "fxviz_unread_outputs"  # the joint graph's meta: the outputs requiring grad that the loss does not read


class Unread:
    """The paths of the model's outputs requiring grad that the loss does not read, as non-strict
    export's trace sees them (``watch``: only then; strict export's Dynamo cannot read ``grad_fn``)."""

    def __init__(self) -> None:
        self.watch = False
        self.paths: list[str] = []


class Raised:
    """Where the loss raised on the traced output: that output, its tensors as :class:`_Blank` (an
    object of its own: export puts the module's attributes back after it traces)."""

    def __init__(self) -> None:
        self.output: Any = None


class LossModel(nn.Module):
    """The model and its loss as one module whose forward takes the flat input tensors and returns
    the loss (``model`` is the prefix capture strips from module paths)."""

    def __init__(self, model: nn.Module, flat: FlatInputs, loss: Loss | None) -> None:
        super().__init__()
        self.model = model
        self._flat = flat
        self._loss = loss
        self.unread = Unread()  # export puts the module's own attributes back after it traces
        self.raised = Raised()

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        args, kwargs = self._flat.rebuild(tensors)
        output = self.model(*args, **kwargs)
        try:
            value = step_loss(output, self._loss)
        except LossError:
            raise
        except Exception:
            if self._loss is not None:
                with contextlib.suppress(Exception):  # a symbolic size: no real tensor to make, export's error stands
                    self.raised.output = torch.utils._pytree.tree_map_only(torch.Tensor, _Blank.of, output)
            raise
        if self.unread.watch and value.grad_fn is not None:  # non-strict export, its run that records autograd
            self.unread.paths = unread_outputs(output, value)
        return value


class _Blank:
    """A tensor of the traced output, by shape and dtype: made again, real, to run the loss on."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        self.shape, self.dtype = shape, dtype

    @classmethod
    def of(cls, t: torch.Tensor) -> _Blank:
        return cls(tuple(int(d) for d in t.shape), t.dtype)

    def real(self) -> torch.Tensor:
        if self.dtype.is_floating_point or self.dtype.is_complex:
            return torch.randn(self.shape, dtype=self.dtype, requires_grad=True)
        return torch.zeros(self.shape, dtype=self.dtype)


def loss_type_error(wrapper: LossModel) -> LossError | None:
    """Where the loss raised on the traced output: the eager path's error if it returns no tensor.
    A traced value is symbolic, so a loss that makes a Python number of it (``float(y.sum())``)
    raises export's data-dependent error, not the type the user's loss returns: run the loss on real
    tensors of the output's shapes to see it."""
    if wrapper.raised.output is None or wrapper._loss is None:
        return None
    try:
        value = wrapper._loss(torch.utils._pytree.tree_map_only(_Blank, _Blank.real, wrapper.raised.output))
    except Exception:  # the loss raises on real tensors too: export's own error says where
        return None
    return None if isinstance(value, torch.Tensor) else LossError(
        f"loss returned {returned(value)}, not a tensor: return a scalar tensor")


def export_joint(model: nn.Module, flat: FlatInputs, loss: Loss | None, stack: contextlib.ExitStack) -> torch.fx.GraphModule:
    """The joint graph of ``model`` and its loss: ``torch.export`` (non-strict) of :class:`LossModel`,
    then AOT Autograd's joint export of the exported module, which keeps export's module stacks. A
    model that calls ``torch.utils.checkpoint`` is exported strictly, so that the joint graph keeps
    its regions (:mod:`fxviz.symbolic.checkpoint`)."""
    from torch._functorch.aot_autograd import aot_export_joint_with_descriptors

    wrapper = LossModel(model, flat, loss)
    wrapper.unread.watch = True
    with checkpoint_calls(model) as seen:
        try:
            ep = torch.export.export(wrapper, flat.tensors, strict=False)
        except Exception as e:
            error = loss_type_error(wrapper)
            if error is not None:
                raise error from e
            raise
    calls = seen.kinds
    custom = custom_functions(ep.graph)
    if custom:
        raise CaptureError(
            f"export inlines the forward of the custom autograd.Function {', '.join(custom)} and differentiates its "
            "ops, not its own backward: the eager path (method='eager') runs the Function's backward")
    rnns = rnn_layers(ep.graph)
    if rnns:
        raise CaptureError(
            f"export decomposes {', '.join(rnns)} into per-step cell ops, which are not what eager runs (a fused "
            "kernel: MKLDNN's LSTM on CPU, cuDNN's on CUDA; else ATen's own cells): the joint graph's saved "
            "activations and backward ops would not be the step's; the eager path (method='eager') records them")
    wrapper.unread.watch = False
    if calls:
        ep = strict_program(wrapper, flat.tensors, calls)
    joint = aot_export_joint_with_descriptors(stack, ep.module(), flat.tensors, _record_nn_module_stack=True)
    joint.graph_module.meta[CALLS] = len(calls)
    joint.graph_module.meta[CALLERS] = seen.callers
    joint.graph_module.meta[UNREAD] = wrapper.unread.paths
    return joint.graph_module


def _subclasses(cls: type) -> list[type]:
    out: list[type] = []
    todo: list[type] = [cls]
    while todo:
        subs: list[type] = todo.pop().__subclasses__()
        for sub in subs:
            out.append(sub)
            todo.append(sub)
    return out


_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def custom_functions(graph: torch.fx.Graph) -> list[str]:
    """The custom ``autograd.Function`` classes (outside torch) whose ``forward`` ran while ``graph``
    was traced, by the source lines of its nodes: non-strict export inlines such a forward, so the
    joint graph would differentiate its ops instead of running its backward."""
    spans: dict[str, list[tuple[int, int, str]]] = {}
    for cls in _subclasses(torch.autograd.Function):
        if cls.__module__.startswith("torch"):
            continue
        fwd = cls.__dict__.get("forward")
        code = getattr(getattr(fwd, "__func__", fwd), "__code__", None)
        lines = [line for _, _, line in code.co_lines() if line] if code is not None else []
        if code is not None and lines:
            spans.setdefault(code.co_filename, []).append((min(lines), max(lines), cls.__qualname__))
    found: dict[str, None] = {}
    if spans:
        for n in graph.nodes:
            for file, line in _FRAME.findall(n.meta.get("stack_trace") or ""):
                for lo, hi, name in spans.get(file, ()):
                    if lo <= int(line) <= hi:
                        found[name] = None
    return list(found)


def capture_joint(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], *, loss: Loss | None = None) -> Graph:
    """The graph of one training step of ``model`` on the inputs, through the joint graph."""
    flat = flatten_inputs(model, args, kwargs)
    check_trainable(model, flat.tensors)
    with contextlib.ExitStack() as stack:
        gm = export_joint(model, flat, loss, stack)
        return graph_from_joint(gm, model, flat)


def _strip(target: str) -> str:
    return target[len(PREFIX) + 1:] if target.startswith(PREFIX + ".") else target


def _placeholder(desc: Any, names: list[str]) -> Placeholder:
    kind = type(desc).__name__
    if kind == "ParamAOTInput":
        return Placeholder("parameter", _strip(desc.target), _strip(desc.target))
    if kind == "BufferAOTInput":
        return Placeholder("buffer", _strip(desc.target), _strip(desc.target))
    if kind == "PlainAOTInput" and desc.idx < len(names):
        return Placeholder("input", names[desc.idx], names[desc.idx])
    if kind == "TangentAOTInput":
        return Placeholder("input", "grad of loss", "grad of loss", phase="backward")
    return Placeholder("input", str(desc), str(desc))


def _output_name(desc: Any, names: list[str]) -> tuple[str, str]:
    """(output name, what it is the gradient of, or "")."""
    kind = type(desc).__name__
    if kind == "PlainAOTOutput":
        return "loss", ""
    if kind == "GradAOTOutput":
        of = desc.grad_of
        target = _strip(of.target) if hasattr(of, "target") else (
            names[of.idx] if type(of).__name__ == "PlainAOTInput" and of.idx < len(names) else str(of))
        return f"grad of {target}", target
    if kind == "InputMutationAOTOutput":  # the step writes it back in place (a batch norm's running statistics)
        of = desc.mutated_input
        target = _strip(of.target) if hasattr(of, "target") else (
            names[of.idx] if type(of).__name__ == "PlainAOTInput" and of.idx < len(names) else str(of))
        return f"{target} (updated)", ""
    return str(desc), ""


def graph_from_joint(gm: torch.fx.GraphModule, model: nn.Module, flat: FlatInputs) -> Graph:
    """The IR of a joint graph (see the module's docstring)."""
    placeholders = {n.name: _placeholder(n.meta.get("desc"), flat.names) for n in gm.graph.nodes if n.op == "placeholder"}
    conv = Converter(placeholders, strip=PREFIX, modules=dict(model.named_modules()))
    conv.convert(gm.graph, gm)
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    descs = out.meta.get("desc") or [None] * len(out.args[0])
    items, grads = [], {}
    first: dict[int, str] = {}
    canonical = {name: first.setdefault(id(p), name) for name, p in model.named_parameters(remove_duplicate=False)}
    for v, desc in zip(out.args[0], descs, strict=False):
        if v is None or desc is None:
            continue
        name, of = _output_name(desc, flat.names)
        if of in canonical and canonical[of] != of:  # a tied parameter: named as the model first names it
            of = canonical[of]
            name = f"grad of {of}"
        items.append((name, v, None))
        if of:
            grads[name] = of
    if not grads:  # the loss reads no parameter or input that requires grad: the eager path's one line
        raise LossError(NOTHING_TO_DIFFERENTIATE)
    conv.add_outputs(items)
    for node in conv.nodes:
        if node.kind == "output" and node.target in grads:
            node.phase, node.attrs["grad_of"] = "backward", grads[node.target]
    mark_tied(conv.nodes, model)
    frozen = {_strip(f"{PREFIX}.{name}") for name, p in model.named_parameters() if not p.requires_grad}
    for node in conv.nodes:
        if node.kind == "parameter" and node.target in frozen:
            node.attrs["frozen"] = True
    graph = Graph(name=type(model).__name__, nodes=conv.nodes, method="export (joint)", modules=module_infos(model))
    graph.saved = inferred_saved(gm, conv)
    unread = gm.meta.get(UNREAD) or []
    if unread:
        graph.notes.append(
            f"the loss does not read {', '.join(unread[:3])}{' ...' if len(unread) > 3 else ''}: the joint graph keeps "
            "only what the loss needs, so the ops that make only those are not in it, nor what eager autograd saves "
            "for them while the output lives (method='eager' shows both)")
    with_recompute(gm, conv, graph)
    return graph


def _is_view(n: torch.fx.Node) -> bool:
    schema = getattr(n.target, "_schema", None)
    return bool(schema is not None and schema.returns and schema.returns[0].alias_info is not None
                and not schema.returns[0].alias_info.is_write)


def _is_idle_dropout(n: torch.fx.Node) -> bool:
    """A dropout that drops nothing (eval mode, ``p=0``), which the traced program makes a ``clone``:
    eager ``F.dropout`` returns its very input then, so the two share a storage."""
    fn = n.meta.get("torch_fn")
    return n.target is torch.ops.aten.clone.default and isinstance(fn, tuple) and "dropout" in str(fn[-1])


def _base(n: torch.fx.Node) -> torch.fx.Node:
    """The value whose storage ``n`` shares: through views, through ``getitem`` of an op that returns
    views (``split``'s pieces share one storage), and through a dropout that drops nothing."""
    while n.op == "call_function" and n.args and isinstance(n.args[0], torch.fx.Node) and (
            _is_view(n) or (n.target is operator.getitem and _is_view(n.args[0])) or _is_idle_dropout(n)):
        n = n.args[0]
    return n


def _nbytes(n: torch.fx.Node) -> int:
    val = n.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return 0
    size = ITEMSIZE.get(str(val.dtype).removeprefix("torch."), 0)
    try:
        return int(val.untyped_storage().nbytes()) if val.untyped_storage() is not None else size * val.numel()
    except Exception:  # a size that is symbolic: the storage has no size to tell
        return 0


def _forward_by_seq(gm: torch.fx.GraphModule) -> dict[int, torch.fx.Node]:
    fwd_by_seq: dict[int, torch.fx.Node] = {}
    for n in gm.graph.nodes:
        if n.meta.get("partitioner_tag") == "is_forward" and n.op == "call_function" and "seq_nr" in n.meta:
            # the op that made that autograd node is the first tagged with its number: the ops after it
            # that make none (a detach, an integer buffer's update) carry the number on
            fwd_by_seq.setdefault(n.meta["seq_nr"], n)
    return fwd_by_seq


def _written_back(gm: torch.fx.GraphModule) -> dict[torch.fx.Node, torch.fx.Node]:
    """Each value the step writes back into a buffer or an input (``InputMutationAOTOutput``: a batch
    norm's running statistics) -> that placeholder: eager updates it in place, in the same storage."""
    placeholders = {repr(n.meta.get("desc")): n for n in gm.graph.nodes if n.op == "placeholder"}
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    written: dict[torch.fx.Node, torch.fx.Node] = {}
    for v, desc in zip(out.args[0], out.meta.get("desc") or (), strict=False):
        target = placeholders.get(repr(getattr(desc, "mutated_input", None)))
        if type(desc).__name__ == "InputMutationAOTOutput" and isinstance(v, torch.fx.Node) and target is not None:
            written[_base(v)] = target
    return written


def _reads_again(gm: torch.fx.GraphModule, recomputed: frozenset[torch.fx.Node],
                 region: dict[torch.fx.Node, int]) -> set[tuple[torch.fx.Node, torch.fx.Node]]:
    """(backward op, recomputed value) where the backward op reads the value's recomputation: its
    forward op (by ``seq_nr``) is in the value's checkpoint ``region``, so what it saved was
    recomputed; an op outside the region saves a value the region made as it is."""
    fwd_by_seq = _forward_by_seq(gm)
    of_seq = {seq: region[f] for seq, f in fwd_by_seq.items() if f in region}
    return {(u, n) for n in recomputed for u in n.users if u.meta.get("partitioner_tag") == "is_backward"
            and of_seq.get(u.meta.get("seq_nr", -1)) == region[n]}


def _saved_pairs(gm: torch.fx.GraphModule, conv: Converter, recomputed: frozenset[torch.fx.Node] = frozenset(),
                 kept: frozenset[torch.fx.Node] = frozenset(), again: frozenset[tuple[torch.fx.Node, torch.fx.Node]] = frozenset(),
                 region: dict[torch.fx.Node, int] | None = None) -> list[tuple[torch.fx.Node, torch.fx.Node, torch.fx.Node, str, int]]:
    """(saver, value, its base, shares, bytes) for each forward value the backward reads (see
    :func:`inferred_saved`), in the order the savers run: the first to save a storage pays for it,
    as in eager."""
    fwd_by_seq = _forward_by_seq(gm)
    written = _written_back(gm)
    region = region or {}
    placeholders = {n: conv.placeholders[n.name] for n in gm.graph.nodes if n.op == "placeholder"}
    position = {n: i for i, n in enumerate(gm.graph.nodes)}
    pairs: list[tuple[torch.fx.Node, torch.fx.Node]] = []
    seen_pairs: set[tuple[torch.fx.Node, torch.fx.Node]] = set()
    for n in gm.graph.nodes:
        if n.meta.get("partitioner_tag") != "is_forward" or n.op == "output" or n not in conv.refs:
            continue
        savers = [n] if n in kept else []  # a selective policy keeps what such an op makes
        for u in n.users:
            if u in recomputed:  # read by a recomputation: kept for it, unless recomputed in its region
                savers += [] if n in recomputed and region.get(n) == region[u] else [u]
            elif u.meta.get("partitioner_tag") == "is_backward" and u.op != "output" and (u, n) not in again:
                savers.append(fwd_by_seq.get(u.meta.get("seq_nr", -1), n))
        for saver in savers:
            if (saver, n) in seen_pairs or saver not in conv.refs:
                continue
            seen_pairs.add((saver, n))
            pairs.append((saver, n))
    counted: set[torch.fx.Node] = set()
    out: list[tuple[torch.fx.Node, torch.fx.Node, torch.fx.Node, str, int]] = []
    for saver, n in sorted(pairs, key=lambda p: (position[p[0]], position[p[1]])):
        base = _base(n)
        base = written.get(base, base)
        shares, nbytes = "", 0
        if base in placeholders:
            shares = placeholders[base].kind if placeholders[base].kind in ("parameter", "buffer") else "input"
        elif base in counted:
            shares = "view"
        else:
            counted.add(base)
            nbytes = _nbytes(base)
        out.append((saver, n, base, shares, nbytes))
    return out


def inferred_saved(gm: torch.fx.GraphModule, conv: Converter, recomputed: frozenset[torch.fx.Node] = frozenset(),
                   kept: frozenset[torch.fx.Node] = frozenset(),
                   again: frozenset[tuple[torch.fx.Node, torch.fx.Node]] = frozenset(),
                   region: dict[torch.fx.Node, int] | None = None, callers: dict[int, str] | None = None) -> list[Saved]:
    """The forward values the backward reads, saved by the forward op of the reading op's
    ``seq_nr`` (else by the op that made the value), each storage counted once. With checkpoint
    regions: a ``recomputed`` op's value is not saved for the backward ops that read it ``again``
    (recomputed), what the recomputation reads is (saved by the op recomputed; a value from outside
    the region, its input, in the module that called checkpoint, ``callers`` by region, as torch packs
    it; not a parameter or buffer, which checkpoint reads again from the module and torch packs no
    tensor for), and so is every value of an op a selective policy ``kept`` (saved by that op)."""
    out: list[Saved] = []
    region, callers = region or {}, callers or {}
    for saver, n, _base_node, shares, nbytes in _saved_pairs(gm, conv, recomputed, kept, again, region):
        if saver in recomputed and shares in ("parameter", "buffer"):
            continue  # checkpoint reads it again from the module: torch packs nothing for it
        val = n.meta.get("val")
        saver_node = conv.by_name[conv.refs[saver].node]
        module = saver_node.module
        if saver in recomputed and region.get(n) != region[saver] and shares not in ("parameter", "buffer"):
            module = callers.get(region[saver], module)
        meta = saver_node.meta if not isinstance(val, torch.Tensor) else None
        shape = tuple(int(d) if isinstance(d, int) else str(d) for d in val.shape) if isinstance(val, torch.Tensor) else ()
        dtype = str(val.dtype).removeprefix("torch.") if isinstance(val, torch.Tensor) else (meta.dtype if meta else "")
        dtype, nbytes, inferred, reason = as_eager(n, dtype, nbytes)
        out.append(Saved(saver_node.name, module, shape, dtype, nbytes, conv.refs[n].node, shares,
                         inferred=inferred, reason=reason))
    return out


def with_recompute(gm: torch.fx.GraphModule, conv: Converter, graph: Graph) -> None:
    """The checkpoint regions torch tagged in the joint graph on ``graph``: its recompute nodes
    (:func:`~fxviz.symbolic.checkpoint.add_recompute`) and saved records. A recomputed forward op's
    ``would_save`` is what the step without checkpoint would save for it (the records of the
    recomputed op, else of the op that made the recomputed value, whose storage the checkpointed step
    does not keep)."""
    tags = recompute_tags(gm)
    if not tags and not gm.meta.get(CALLS):
        return
    # a region is recomputed when the backward unpacks what its ops saved: a backward op of one of them
    fwd_by_seq = _forward_by_seq(gm)
    used = {tags[f][0] for u in gm.graph.nodes if u.meta.get("partitioner_tag") == "is_backward"
            and (f := fwd_by_seq.get(u.meta.get("seq_nr", -1))) in tags}
    tags = {n: t for n, t in tags.items() if t[0] in used}
    if not tags:
        if gm.meta.get(CALLS):
            graph.notes.append(f"torch.utils.checkpoint ran {gm.meta[CALLS]} time(s), but the backward differentiates "
                               "no op of its region(s): nothing is recomputed")
        return
    region = {n: r for n, (r, _) in tags.items()}
    recomputed = frozenset(n for n, (_, policy) in tags.items() if policy in RECOMPUTE)
    kept = frozenset(n for n, (_, policy) in tags.items() if policy in SAVE)
    again = frozenset(_reads_again(gm, recomputed, region))
    pairs = _saved_pairs(gm, conv, recomputed, kept, again, region)
    bases = {base for _, _, base, _, _ in pairs}
    would_save: dict[str, int] = {}
    for saver, n, base, _, nbytes in _saved_pairs(gm, conv):
        owner = saver if saver in recomputed else n if n in recomputed else None
        if nbytes and owner is not None and base not in bases:
            name = conv.refs[owner].node
            would_save[name] = would_save.get(name, 0) + nbytes
    rewire = {(conv.refs[u].node, conv.refs[n].node) for u, n in again if u in conv.refs and n in conv.refs}
    graph.nodes = add_recompute(list(graph.nodes), {conv.refs[n].node: t for n, t in tags.items()
                                 if n in conv.refs and isinstance(n.target, torch._ops.OpOverload)},
                                would_save, rewire)
    one_region_per_call(graph.nodes)
    callers = gm.meta.get(CALLERS) or []
    all_regions = {r for r, _ in recompute_tags(gm).values()}
    # regions are numbered in the order their first op runs: the calls' order where none is nested in another
    by_region = dict(enumerate(callers)) if len(all_regions) == len(callers) else {}
    graph.saved = inferred_saved(gm, conv, recomputed, kept, again, region, by_region)
    regions = len({region for region, _ in tags.values()})
    graph.notes.append(f"torch.utils.checkpoint: {regions} region(s) as strict export and AOT Autograd tagged them "
                       "(non-strict export traces through a checkpoint)")


__all__ = ["LossModel", "capture_joint", "custom_functions", "export_joint", "graph_from_joint", "inferred_saved", "with_recompute"]
