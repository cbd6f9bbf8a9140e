"""``capture(backward=True)`` without export: the eager tracer's forward, the autograd graph of that
real run, and its saved activations -> one graph of a training step.

While the tracer records the forward (:func:`~fxviz.fallback.trace.trace_eager` with ``grad=True``),
a :class:`Watch` inside its recording mode sees each call the recorder records: the ``grad_fn`` of
each output is mapped to the recorded node (one set on a tensor after it was made, by a custom
``autograd.Function``, to the node that made the tensor when a later call reads it), and every
tensor autograd packs (``saved_tensors_hooks``) while the call runs is saved by that node; what a
``torch.utils.checkpoint`` call packs to run its region again (its inputs) is saved by the region's
first op, in the module that called checkpoint. A forward hook on the model computes the loss inside
the recording, so the loss's ops are in the graph.

Then the autograd graph is walked from the loss (``grad_fn.next_functions``): each autograd node is
one backward op (its ``grad_fn`` class as target: ``AddmmBackward0``), placed in the module call of
the forward op it differentiates, or, made inside a call (``TBackward0`` inside ``F.linear``), of
the node that reads its gradient (``attrs["stack_inferred"]``; ``attrs["made_by"]``: the op that
made the shard of a DTensor an unseen autograd Function made, DTensor's redistribution in a hook),
reading the gradients its consumers produce and the values its forward op saved, in the order
autograd runs them. ``AccumulateGrad`` is a parameter's gradient: an output ``grad of <name>``. The
backward then runs for real, once (``.grad`` untouched, but for FSDP2's gradient reduce-scatters,
which read it: put back afterwards), with hooks on the autograd nodes that record the gradients'
shapes; a backward that raises marks its node and leaves the forward graph with the error
(:class:`~fxviz.torchbridge.training.BackwardError`).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils.checkpoint
from torch import nn
from torch.autograd.graph import _engine_run_backward
from torch.overrides import TorchFunctionMode

from fxviz.errors import ModelError
from fxviz.fallback.fsdp import unsharded_names
from fxviz.fallback.observe import PLAIN_TENSORS
from fxviz.fallback.ownbackward import Stack, handed_stack, hands_on, hooked_stack, snake, walk
from fxviz.fallback.recompute import Recompute, cache_filled, place, policy_saved, storage_key, would_save
from fxviz.fallback.recorder import Recorder
from fxviz.fallback.tensors import tensor_meta
from fxviz.fallback.trace import FakeRun, meta_sharded, trace_eager
from fxviz.ir import Graph, Node, Ref, Saved
from fxviz.torchbridge.checkpoint import Checkpoints
from fxviz.torchbridge.normalize import flatten_inputs, flatten_outputs
from fxviz.torchbridge.training import (
    NOTHING_TO_DIFFERENTIATE,
    BackwardError,
    Loss,
    LossError,
    check_trainable,
    reachable,
    step_loss,
)

_plain = torch._C.DisableTorchFunction
#: a forward that ran a backward itself, whose graph the step's backward then found freed
OWN_BACKWARD = ("the model's forward ran a backward itself ({n} torch.autograd.backward or grad calls: a pipeline "
                "schedule's step with a loss_fn runs each microbatch's), {why}: capture it without backward=True; that graph has "
                "the backward the forward ran, node by node")
#: why backward=True cannot differentiate after the forward's own backward
FREED = "which freed the graph backward=True differentiates again"
NO_LOSS = "and returned no loss for backward=True to differentiate again"


class Watch(TorchFunctionMode):
    """Inside the recorder's mode: maps ``grad_fn`` and saved tensors to recorded nodes (see above)."""

    def __init__(self, model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        super().__init__()
        self.rec: Recorder | None = None
        self.fn_node: dict[Any, tuple[str, int]] = {}  # grad_fn -> (node name, output index)
        self.made_by: dict[Any, str] = {}  # grad_fn of a DTensor an unseen Function made -> its shard's node
        self.saved: list[tuple[str, Any, int | None]] = []  # (saving node, record, checkpoint call): see held()
        self.pending: list[Any] = []
        self.region_pending: list[Any] = []  # packed inside a checkpoint's region: checkpoint keeps a placeholder
        #: (op, tensor) per tensor an op of a checkpoint's region packed: what it would save without checkpoint
        self.unsaved: list[tuple[str, torch.Tensor]] = []
        self.caches: list[dict[Any, dict[int, Any]]] = []  # the caches of the selective checkpoints running now
        self.cache_seen: set[tuple[int, Any, int]] = set()
        #: (op, tensor) per value a selective checkpoint's policy cached in the forward (memory the step holds)
        self.cached: list[tuple[str, torch.Tensor]] = []
        self.inputs_of: list[tuple[int, list[torch.Tensor]]] = []  # checkpoint calls saving their inputs now
        self.counted: set[tuple[int, str]] = set()
        self.saved_values: set[tuple[str, int]] = set()  # forward values (node, output) something saved
        self.holders: list[list[Any]] = []  # what pack gave autograd: [tensor, its version]
        self.own_backward = 0  # backward calls the forward made
        #: called in the backward with each tensor a checkpoint's unpack hook returns (see :meth:`inside`)
        self.on_unpack: Callable[[torch.Tensor], None] | None = None
        self.state: dict[tuple[int, str], str] = {}
        for p in model.parameters():
            self.state[storage_key(p)] = "parameter"
        for b in model.buffers():
            self.state.setdefault(storage_key(b), "buffer")
        for t in inputs:
            self.state.setdefault(storage_key(t), "input")

    @contextlib.contextmanager
    def attach(self, rec: Recorder) -> Iterator[None]:
        self.rec = rec
        with self, torch.autograd.graph.saved_tensors_hooks(self.pack, _unpack):
            yield
            self._flush()

    def _flush(self) -> None:
        """Tensors packed outside any call the recorder saw (a custom ``autograd.Function`` saves
        after its forward's ops ran): saved by the last op recorded."""
        assert self.rec is not None
        packed, self.pending = self.pending, []
        for t in packed:
            self._record(self._last(), t)
        unsaved, self.region_pending = self.region_pending, []
        self.unsaved += [(self._last(), t) for t in unsaved]

    @contextlib.contextmanager
    def inside(self, _call: int) -> Iterator[None]:
        """A non-reentrant checkpoint's forward runs: checkpoint's own saved-tensor hooks (the innermost),
        wrapped, also hand each tensor they keep a placeholder for here, with the op that packed it
        (:attr:`unsaved`): what that op would keep without checkpoint."""
        top = torch._C._autograd._top_saved_tensors_default_hooks(False)
        if top is None:
            yield
            return
        pack, unpack = top

        def wrapped(t: torch.Tensor) -> Any:
            self.region_pending.append(t)
            return pack(t)

        def unwrapped(h: Any) -> Any:  # in the backward: a recomputed value, read by the backward op running
            t = unpack(h)
            if self.on_unpack is not None and isinstance(t, torch.Tensor):
                self.on_unpack(t)
            return t

        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        caching = [m for m in _get_current_dispatch_mode_stack()
                   if isinstance(m, torch.utils.checkpoint._CachingTorchDispatchMode)]
        if caching:  # a selective checkpoint: its forward caches what the policy saves (storage[op key][index])
            self.caches.append(caching[-1].storage)
        try:
            with torch.autograd.graph.saved_tensors_hooks(wrapped, unwrapped):
                yield
        finally:
            if caching:
                self.caches.pop()
        with _plain():
            if self.region_pending:
                self._flush()

    def _last(self) -> str:
        assert self.rec is not None
        return next((n.name for n in reversed(self.rec.nodes) if n.kind == "op"), "")

    @contextlib.contextmanager
    def saving_inputs(self, call: int) -> Iterator[None]:
        """``torch.utils.checkpoint`` call ``call`` saving its region's inputs (to run it again): each
        is the call's record (:meth:`held`), however many ops run meanwhile."""
        with _plain():
            if self.pending:
                self._flush()
        self.inputs_of.append((call, []))
        try:
            yield
        finally:
            _, packed = self.inputs_of.pop()
            with _plain():
                for t in packed:
                    self._record(self._last(), t, call)

    def pack(self, t: torch.Tensor) -> list[Any]:
        (self.inputs_of[-1][1] if self.inputs_of else self.pending).append(t)
        holder = [t, t._version]  # autograd skips its version check under hooks: _unpack makes it
        self.holders.append(holder)
        return holder

    def release(self) -> None:
        """Let go of every saved tensor and autograd node: a tensor saved by its own autograd node (an
        output) makes a cycle through C++ the collector never breaks (holder, tensor, node)."""
        self.fn_node.clear()
        self.made_by.clear()
        for holder in self.holders:
            holder.clear()
        self.holders.clear()
        self.unsaved.clear()
        self.cached.clear()

    def _producer(self, t: torch.Tensor) -> str:
        assert self.rec is not None
        e = self.rec.versions.values.get(t)
        if e is None and t._base is not None:
            e = self.rec.versions.values.get(t._base)
        if e is None:
            return ""
        self.saved_values.add((e[0].node, e[0].index))
        return e[0].node

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        rec = self.rec
        assert rec is not None
        if func is torch.autograd.backward or func is torch.Tensor.backward or func is torch.autograd.grad:
            self.own_backward += 1  # the forward runs a backward itself (a pipeline schedule's step)
        with _plain():  # reading grad_fn is a call the recorder's mode would see
            for a in args:  # a grad_fn set after the tensor was made (a custom autograd.Function's output)
                gf = a.grad_fn if isinstance(a, torch.Tensor) else None
                if gf is not None and gf not in self.fn_node:
                    e = rec.versions.values.get(a)
                    if e is not None:
                        self.fn_node[gf] = (e[0].node, e[0].index)
                    elif type(a) not in PLAIN_TENSORS and (ref := rec._local_value(a)) is not None:
                        self.made_by.setdefault(gf, ref.node)
            if self.pending or self.region_pending:
                self._flush()
        before = len(rec.nodes)
        try:
            out = func(*args, **(kwargs or {}))
        finally:
            packed, self.pending = self.pending, []
            unsaved, self.region_pending = self.region_pending, []
        with _plain():
            node = rec.nodes[-1] if len(rec.nodes) > before and rec.nodes[-1].kind == "op" else None
            if node is not None:
                outs = out if isinstance(out, tuple | list) else (out,)
                for i, o in enumerate(outs):
                    gf = o.grad_fn if isinstance(o, torch.Tensor) else None
                    if gf is not None and gf not in self.fn_node:
                        self.fn_node[gf] = (node.name, i)
            saver = node.name if node is not None else (rec.nodes[-1].name if rec.nodes else "")
            for t in packed:
                self._record(saver, t)
            self.unsaved += [(saver, t) for t in unsaved]
            if self.caches:  # the entries the running selective checkpoints' caches gained: cached by this op
                self.cached += [(saver, t) for t in cache_filled(self.caches, self.cache_seen)]
        return out

    def _record(self, saver: str, t: torch.Tensor, call: int | None = None) -> None:
        key = storage_key(t)
        nbytes = 0 if key in self.state else t.untyped_storage().nbytes()
        m = tensor_meta(t)
        self.saved.append((saver, (m.shape, m.dtype, key, nbytes, self._producer(t)), call))

    def held(self, roots: list[Any]) -> list[tuple[str, int | None, tuple[Any, ...]]]:
        """Each record as (saver, the checkpoint call that saved it as its input or None, (shape,
        dtype, bytes, value, shares)), as autograd holds it when the backward starts: one saved by an
        op none of whose autograd nodes the ``roots`` (the loss's and the outputs' ``grad_fn``) reach
        was saved in a dropped branch, which a real step frees (fxviz's hooks make a cycle only the
        collector breaks): ``freed``, costing nothing. Each storage held is counted once."""
        reached = reachable(roots)
        made = {at[0] for at in self.fn_node.values()}
        live = {at[0] for f, at in self.fn_node.items() if f in reached}
        out: list[tuple[str, int | None, tuple[Any, ...]]] = []
        for saver, (shape, dtype, key, nbytes, value), call in self.saved:
            shares = self.state.get(key, "")
            if not shares and saver in made and saver not in live:
                shares, nbytes = "freed", 0
            elif not shares and key in self.counted:
                shares, nbytes = "view", 0
            elif not shares:
                self.counted.add(key)
            out.append((saver, call, (shape, dtype, nbytes, value, shares)))
        return out


def _unpack(packed: list[Any]) -> torch.Tensor:
    """The saved tensor, as autograd's own unpacking checks it (under ``saved_tensors_hooks`` autograd
    leaves its version check out: a tensor changed in place after it was saved would give gradients
    that the real step refuses with this error)."""
    t, version = packed
    if t._version != version:
        raise RuntimeError(f"one of the variables needed for gradient computation has been modified by an inplace "
                           f"operation: [{t.type()} {list(t.shape)}] is at version {t._version}; expected version "
                           f"{version} instead: the real step raises this too; make the in-place op that follows "
                           f"the op saving it out-of-place (relu_ -> relu, x += y -> x = x + y)")
    return t


def trace_backward(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], *, loss: Loss | None = None,
                   level: str = "function") -> Graph:
    """The graph of one training step by the eager tracer (see the module's docstring)."""
    flat = flatten_inputs(model, args, kwargs)
    check_trainable(model, flat.tensors)
    # FSDP2 sharded on meta: the whole step on the fake shards (the backward's collectives read them too)
    fake = FakeRun(model, args, kwargs) if meta_sharded(model) else None
    with fake if fake is not None else contextlib.nullcontext():
        args, kwargs, inputs = (fake.args, fake.kwargs, fake.tensors) if fake else (args, kwargs, flat.tensors)
        watch = Watch(model, inputs)
        try:
            graph = _step(model, args, kwargs, loss, level, inputs, watch, fake)
        finally:  # whatever happened, nothing the step saved outlives it
            watch.release()
    return graph


def _step(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], loss: Loss | None, level: str,
          inputs: tuple[torch.Tensor, ...], watch: Watch, fake: FakeRun | None = None) -> Graph:
    """The forward recorded with ``watch`` on (on ``fake`` when given), then the backward added."""
    checkpoints = Checkpoints()
    checkpoints.saving, checkpoints.inside = watch.saving_inputs, watch.inside
    box: list[torch.Tensor] = []

    def on_output(_m: nn.Module, _a: Any, out: Any) -> None:
        box.append(step_loss(out, loss))
        output.append(out)  # held until the backward, as a training step holds it

    output: list[Any] = []

    handle = model.register_forward_hook(on_output)
    try:  # checkpoint's early stop as the user's step has it: the backward reruns what torch's does
        graph = trace_eager(model, args, kwargs, level=level, fake=fake or False, grad=True, watch=watch.attach,
                            checkpoints=checkpoints)
    except ModelError as e:
        if isinstance(e.__cause__, LossError):  # the step's own backward, not the loss, is what the user must change
            raise (LossError(OWN_BACKWARD.format(n=watch.own_backward, why=NO_LOSS)) if watch.own_backward
                   else e.__cause__) from None
        raise
    finally:
        handle.remove()
    if not box:
        raise LossError(f"{type(model).__name__} returned without calling its forward hooks: no loss to differentiate")
    value = box.pop()
    if value.grad_fn is None:
        raise LossError(OWN_BACKWARD.format(n=watch.own_backward, why=NO_LOSS) if watch.own_backward
                        else NOTHING_TO_DIFFERENTIATE)
    graph.method += " (backward)"
    try:
        add_backward(graph, model, inputs, value, watch, checkpoints, output)
    except BackwardError as e:  # the forward graph, with what the backward got to and where it raised
        if watch.own_backward:
            raise ModelError(OWN_BACKWARD.format(n=watch.own_backward, why=FREED), graph=graph) from e.__cause__
        raise ModelError(str(e), graph=graph) from e.__cause__
    return graph


def add_backward(graph: Graph, model: nn.Module, inputs: tuple[torch.Tensor, ...], loss: torch.Tensor, watch: Watch,
                 checkpoints: Checkpoints | None = None, outputs: Any = None) -> None:
    """Append the backward of ``loss`` to the forward ``graph`` (see the module's docstring); the
    ``checkpoints`` the forward ran are regions around their forward, recompute and backward ops;
    what autograd holds for the model's ``outputs`` counts as saved (a step holds them too)."""
    checkpoints = checkpoints or Checkpoints()
    nodes = {n.name: n for n in graph.nodes}
    used = set(nodes)

    def unique(base: str) -> str:
        name, i = base, 1
        while name in used:
            name, i = f"{base}_{i}", i + 1
        used.add(name)
        return name

    names: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), name)
    names.update(unsharded_names(model))  # FSDP2's: the gradients go to its unsharded parameters
    for n, t in zip([n for n in graph.nodes if n.kind == "input"], inputs, strict=False):
        names.setdefault(id(t), n.target)
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    for n in graph.nodes:
        if n.kind == "parameter" and n.target in frozen:
            n.attrs["frozen"] = True
    outs = [v.grad_fn for _, v in flatten_outputs(outputs) if isinstance(v, torch.Tensor) and v.grad_fn is not None]
    saved_by: dict[str, list[Ref]] = {}
    first_op = next((n.name for n in graph.nodes if n.kind == "op"), graph.nodes[0].name if graph.nodes else "")
    for saver, call, (shape, dtype, nbytes, value, shares) in watch.held([loss.grad_fn, *outs]):
        if call is not None:  # a checkpoint's input: the region's first op, in the module that called checkpoint
            saver = checkpoints.firsts.get(call, saver)
        saver = saver if saver in nodes else first_op  # packed before any op was recorded
        node = nodes.get(saver)
        module = checkpoints.callers[call] if call is not None else node.module if node is not None else ""
        graph.saved.append(Saved(saver, module, shape, dtype, nbytes, value, shares))
        if value and value in nodes:
            saved_by.setdefault(saver, []).append(Ref(value))

    order, consumers = walk([loss.grad_fn])
    seed = Node(unique("grad of loss"), "input", target="grad of loss", outputs=(tensor_meta(loss),), phase="backward")
    graph.nodes.append(seed)
    bnode: dict[Any, Node] = {}
    ran: dict[str, int] = {}  # backward op (node name) -> its place in the order they run
    hands: dict[str, Stack] = {}  # backward op -> the stack it hands on (a hook's: what it was handed)
    leaves: dict[Any, Any] = {}  # AccumulateGrad -> its tensor
    for f in order:
        var = getattr(f, "variable", None)
        if isinstance(var, torch.Tensor):
            leaves[f] = var
            continue
        fwd = watch.fn_node.get(f)
        attrs: dict[str, Any] = {"seq_nr": f._sequence_nr()}
        ins = [Ref(bnode[c].name, i) for c, i in consumers.get(f, []) if c in bnode] or [Ref(seed.name)]
        handed = [bnode[c] for c, _ in consumers.get(f, []) if c in bnode]
        if fwd is not None and fwd[0] in nodes:
            stack = nodes[fwd[0]].stack
            attrs["forward"] = fwd[0]
            ins += [r for r in saved_by.get(fwd[0], []) if r not in ins]
        else:  # in the module of the backward op that handed it its last gradient: the one run just before it
            stack = handed_stack(handed, ran, hands)
            attrs["stack_inferred"] = True
            made = watch.made_by.get(f)
            if made in nodes:  # DTensor's redistribution in a parallel style's hook: its last op
                attrs["made_by"] = made
                stack = hooked_stack(stack, nodes[made].stack)
        node = Node(unique(snake(type(f).__name__)), "op", target=type(f).__name__, inputs=tuple(ins), stack=stack,
                    attrs=attrs, phase="backward")
        ran[node.name] = len(ran)
        hands_on(node, handed, ran, hands)
        bnode[f] = node
        graph.nodes.append(node)
    counted = set(watch.state) | watch.counted  # storages the step keeps: none of them is what checkpoint saved
    graph.saved += policy_saved(graph, watch.cached, watch.state, counted)  # saved memory too
    try:
        _run_backward(graph, model, loss, bnode, leaves, watch, checkpoints)
    finally:  # a backward that raises: the regions of what it got to
        calls = {n for n, c in checkpoints.members.items() if checkpoints.kinds[c] == "non-reentrant"}
        would_save(graph, watch.unsaved, counted, calls)
        checkpoints.mark(graph.nodes)
    if "reentrant" in checkpoints.kinds:
        reached = {id(t) for t in leaves.values()}
        inside = [name for name, p in model.named_parameters() if p.requires_grad and id(p) not in reached]
        graph.notes.append(
            "a reentrant torch.utils.checkpoint (use_reentrant=True) runs its region again and that region's backward "
            "inside its own backward op (CheckpointFunctionBackward), a nested autograd call not shown op by op"
            + (f": the gradients of {len(inside)} parameters ({', '.join(inside[:3])}{' ...' if len(inside) > 3 else ''}) "
               "are made there" if inside else "") + "; use_reentrant=False shows them")
    for f, t in leaves.items():
        refs = tuple(Ref(bnode[c].name, i) for c, i in consumers.get(f, []) if c in bnode)
        of = names.get(id(t), "input")
        graph.nodes.append(Node(unique(f"grad of {of}"), "output", target=f"grad of {of}", inputs=refs,
                                attrs={"grad_of": of}, phase="backward"))
    loss_at = watch.fn_node.get(loss.grad_fn)
    if loss_at is not None:
        graph.nodes.append(Node(unique("loss"), "output", target="loss", inputs=(Ref(*loss_at),)))


def _run_backward(graph: Graph, model: nn.Module, loss: torch.Tensor, bnode: dict[Any, Node], leaves: dict[Any, Any],
                  watch: Watch, checkpoints: Checkpoints) -> None:
    """Run the backward once, ``.grad`` untouched: the shapes of each node's gradients, the node
    that raises, if one does, and the ops a checkpoint recomputes (:mod:`fxviz.fallback.recompute`)."""
    if not leaves:  # nothing to differentiate for: the walk is all there is
        return
    running: list[tuple[Any, Node]] = []
    handles = []
    for f, node in bnode.items():
        def post(grad_inputs: Any, _grad_outputs: Any, node: Node = node) -> None:
            node.outputs = tuple(tensor_meta(g) for g in grad_inputs)
            if running and running[-1][1] is node:
                running.pop()

        def pre(_grad_outputs: Any, node: Node = node, f: Any = f) -> None:
            running.append((f, node))

        handles += [f.register_hook(post), f.register_prehook(pre)]
    recompute = Recompute(graph, model, running, checkpoints)
    watch.on_unpack = recompute.unpacked
    # a reentrant checkpoint refuses a backward given its inputs (torch.autograd.grad), and its own
    # backward accumulates into .grad: such a step runs as loss.backward() does, every .grad put back
    reentrant = "reentrant" in checkpoints.kinds
    accumulate = _reduces_grads(model) or reentrant
    hooked = [t for t in leaves.values() if getattr(t, "_post_accumulate_grad_hooks", None)]
    if hooked and not accumulate:
        graph.notes.append(f"{len(hooked)} parameters have post-accumulate-grad hooks, which this backward (no "
                           f"gradient accumulated) does not run: what they do (an optimizer step, a collective) "
                           f"is not in the graph")
    kept = {id(t): (t, t.grad) for t in (*model.parameters(), *leaves.values())} if accumulate else {}
    try:
        with recompute:  # the engine itself: torch.autograd.grad would be a call the mode swallows
            _engine_run_backward((loss,), (torch.ones_like(loss),), False, False,
                                 () if reentrant else tuple(leaves.values()), True, accumulate_grad=accumulate)
        place(graph, recompute)
    except Exception as e:
        message = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        where = running[-1][1] if running else None
        if where is not None:
            where.error = message
        graph.error = f"the backward raised {message}" + (f" in {where.target} ({where.module or 'root'})" if where else "")
        raise BackwardError(graph.error) from e
    finally:
        watch.on_unpack = None
        for h in handles:
            h.remove()
        for t, grad in kept.values():
            t.grad = grad


def _reduces_grads(model: nn.Module) -> bool:
    """FSDP2 reduce-scatters the gradients autograd accumulates into ``.grad`` (its post-backward hook
    reads them there): such a model's step accumulates, every ``.grad`` put back afterwards."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return fsdp is not None and any(isinstance(m, fsdp.FSDPModule) for m in model.modules())


__all__ = ["Watch", "add_backward", "trace_backward"]
