"""Tensor identity while a forward runs: which node output each live tensor is, and what the model's
own tensors are called.

* :class:`Versions` maps each tensor to the node output that produced it, with the tensor's version
  counter then: an in-place op bumps the version, so a reader of a mutated tensor is pointed at the
  node that wrote it, also when the write went through a view (views share their base's counter).
* :class:`ModelTensors` knows the model's parameters, buffers and tensor attributes by identity, by
  their state-dict names, and puts back the buffers a forward writes (BatchNorm's statistics).

Tensors are held weakly (:class:`TensorMap`): the trace never keeps a forward's activations alive.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from fxviz.ir import Node, NodeKind, Ref, TensorMeta
from fxviz.torchbridge.normalize import _describe
from fxviz.torchbridge.values import meta_from_value
from fxviz.torchbridge.walk import State, name_tensors


class TensorMap:
    """Tensor -> value by identity, without keeping tensors alive (``WeakIdKeyDictionary`` with
    less per-lookup work: this is on every op's path). A dead tensor's entry is never returned: its
    weak reference no longer resolves to the tensor that now has the same ``id``."""

    __slots__ = ("_d",)

    def __init__(self) -> None:
        self._d: dict[int, tuple[weakref.ref[torch.Tensor], Any]] = {}

    def get(self, t: torch.Tensor) -> Any:
        e = self._d.get(id(t))
        return e[1] if e is not None and e[0]() is t else None

    def __setitem__(self, t: torch.Tensor, value: Any) -> None:
        self._d[id(t)] = (weakref.ref(t), value)


#: (shape, dtype, device) -> the TensorMeta every tensor of that kind shares (read inline by the recorder)
METAS: dict[tuple[Any, ...], TensorMeta] = {}
#: (shape, dtype) -> ``(TensorMeta,)``, the outputs of an op that returns one plain CPU tensor: the
#: recorder's key for most ops, without the ``torch.device`` object that reading ``t.device`` makes
#: (and hashes) each time; one tuple shared by every such node (immutable: a node given one more
#: output gets a new tuple), not one more object per node for the collector to walk
CPU_METAS: dict[tuple[Any, ...], tuple[TensorMeta]] = {}


def tensor_meta(v: Any) -> TensorMeta:
    """TensorMeta of a tensor or Python value seen at runtime (all sizes are concrete). Tensor
    metas are immutable and shared: a model repeats a handful of shapes thousands of times."""
    if isinstance(v, torch.Tensor):
        key = (v.shape, v.dtype, v.device)  # torch.Size hashes as a tuple: no conversion per op
        m = METAS.get(key)
        if m is None:
            m = METAS[key] = TensorMeta(
                tuple(v.shape), str(v.dtype).removeprefix("torch."), v.device.type
            )
        return m
    m = meta_from_value(v)  # Python and symbolic scalars, as every capture method shows them
    if m is not None:
        return m
    if v is None:
        return TensorMeta((), "none")
    return TensorMeta((), "object", value=_describe(v))


def version(t: torch.Tensor) -> int:
    try:
        return t._version
    except RuntimeError:  # inference-mode tensors have no version counter and cannot be mutated
        return 0


def _base(t: torch.Tensor) -> torch.Tensor:
    return t._base if t._base is not None else t


def add_output(node: Node, t: torch.Tensor, previous: Ref | None) -> int:
    """Give ``node`` one more output, tensor ``t`` as the node left it (formerly ``previous``,
    which the node wrote in place); returns its index."""
    k = len(node.outputs)
    node.outputs = (*node.outputs, tensor_meta(t))
    if previous is not None:
        node.attrs.setdefault("aliases", []).append([k, previous.to_json()])
    return k


class Versions:
    """Live tensor -> ``[node output, version when produced]``, and storage -> the node that wrote
    it last. The recorder reads and writes ``values`` directly: that is on every op's path."""

    __slots__ = ("pending", "values", "writes")

    def __init__(self) -> None:
        self.values = TensorMap()  # tensor -> [producer ref, version when it was produced]
        self.writes = TensorMap()  # base tensor -> (node that last wrote its storage, version after)
        # ATen level: writes whose version bump is still to come (see finish_pending)
        self.pending: list[tuple[torch.Tensor, Node, int]] = []

    def lookup(self, t: torch.Tensor, v: int) -> Ref | None:
        """The node output ``t`` (now at version ``v``) is, or None for a tensor never seen."""
        e = self.values.get(t)
        if e is None:
            return None
        return e[0] if v == e[1] else self.changed(t, e, v)  # type: ignore[no-any-return]

    def changed(self, t: torch.Tensor, e: list[Any], v: int) -> Ref:
        """``t``, entry ``e`` of :attr:`values`, is at version ``v`` now, not the one it was
        produced at: if a recorded op wrote its storage last (directly or through a view), ``t`` now
        comes from that op, as an extra output of it."""
        if self.pending:
            self.finish_pending()
            v = version(t)
        w = self.writes.get(_base(t))
        if w is not None and w[1] == v and w[0].name != e[0].node:
            ref = Ref(w[0].name, add_output(w[0], t, e[0]))
        else:
            ref = e[0]
        e[0], e[1] = ref, v
        return ref

    def wrote(self, node: Node, outs: tuple[Any, ...], written: list[torch.Tensor], *, deferred: bool) -> None:
        """``node`` wrote these tensor arguments in place: each is now a value it produced (an extra
        output when the op does not return it), and ``node`` is the writer of its storage.
        ``deferred``: the version moves only after the op returns (ATen level)."""
        for t in written:
            k = next((i for i, o in enumerate(outs) if o is t), None)
            if k is None:
                prev = self.values.get(t)
                k = add_output(node, t, prev[0] if prev is not None else None)
                self.values[t] = [Ref(node.name, k), version(t)]
            if deferred:
                self.pending.append((t, node, k))
                continue
            base = _base(t)
            self.writes[base] = (node, version(t))
            self._through_view(t, base, node)

    def _through_view(self, t: torch.Tensor, base: torch.Tensor, node: Node) -> None:
        """A write to ``t``, a view of ``base``, that moved no version counter (FSDP2 keeps them
        across its copies): the base would read as unwritten, so it comes from ``node`` now."""
        e = self.values.get(base) if base is not t else None
        if e is not None and e[1] == version(base) and e[0].node != node.name:
            e[0] = Ref(node.name, add_output(node, base, e[0]))

    def finish_pending(self) -> None:
        """ATen level: the autograd layer bumps a written tensor's version after the dispatch mode
        returns, so the write is bound to its version at the next op."""
        for t, node, k in self.pending:
            v = version(t)
            self.values[t] = [Ref(node.name, k), v]
            base = _base(t)
            self.writes[base] = (node, v)
            self._through_view(t, base, node)
        self.pending.clear()


class ModelTensors:
    """The model's own tensors by identity -> ``(kind, state-dict name)``: parameters and buffers
    (first name wins, as in ``named_parameters()``), and plain tensor attributes of modules as named
    constants. The model keeps every key alive for the whole capture.

    With ``snapshot_buffers`` (real tensors, not fake ones), the model's tensors are copied before
    the forward can change them, and :meth:`restore` puts back what changed: a buffer when the
    forward first reads it (BatchNorm's kernel updates its running statistics without bumping their
    version counter, so a write cannot be detected, only undone); any parameter, buffer or tensor
    attribute just before a call that may write it (:meth:`before_write`), found by identity or by
    storage (``p.data.mul_(m)`` writes ``p`` through an alias); and the existing ``.grad`` of
    every parameter before a ``backward`` (:meth:`before_backward`). Parameters are copied only
    then: most forwards never write one, and copying them all would double a model's memory.

    The eager tracer's register of the model's tensors, read on every op; not
    :class:`fxviz.torchbridge.guard.ModelState`, the snapshot every capture method puts the whole
    model back from (every module's ``__dict__``, hooks and submodules)."""

    def __init__(self, modules: list[tuple[str, nn.Module]], *, snapshot_buffers: bool,
                 state: State | None = None, made: Callable[[torch.Tensor], Any] | None = None) -> None:
        self._modules = modules
        #: what an op of this forward made (the recorder's producer of a tensor, ``None`` if none):
        #: such a tensor stored on a module (``self.cache = torch.zeros(...)``) is the forward's, not
        #: the model's: never put back (that wrote the zeros back into the cache the forward filled)
        self._made = made
        # tensor id -> (tensor, kind, name): strong references (the model holds these tensors for
        # the whole capture anyway; a weak reference per parameter cost more than a deep model's
        # walk), checked by identity so that a reused id never names another tensor
        #: ``tied``: a tensor the walk met under two names (a tied weight): only then can ``mark_tied``
        #: find anything among ``modules`` (a module met under two paths is the caller's to tell)
        if state is not None:  # the capture's shared walk of these modules (walk.state_of): a copy
            self._names: dict[int, tuple[torch.Tensor, NodeKind, str]] = dict(state[0])
        else:
            state = name_tensors(modules)
            self._names = state[0]
        self.tied = state[2]
        self._attributes_scanned = False
        self._snapshot_buffers = snapshot_buffers
        #: model tensor, an alias of its elements then (``.data``: a later ``.data = ...`` rebinding
        #: leaves it on the elements the copy came from), its copy
        self._saved: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self._backed: set[int] = set()  # ids of the model tensors in _saved
        self._by_storage: dict[int, torch.Tensor] | None = None
        self._grads_saved = False

    def read(self, t: torch.Tensor) -> tuple[NodeKind, str]:
        """What the model calls ``t``, read for the first time: ``("parameter", "fc.weight")``, or
        ``("constant", "")`` for a tensor the model does not own (a global, a closure)."""
        kind: NodeKind
        e = self._names.get(id(t))  # _known(), inlined: every parameter's first read
        known = (e[1], e[2]) if e is not None and e[0] is t else None
        if known is None and not self._attributes_scanned:
            self._scan_attributes(self._modules)
            known = self._known(t)
        kind, name = known or ("constant", "")
        if kind == "buffer" and self._snapshot_buffers:
            self._backup(t)
        return kind, name

    def _scan_attributes(self, modules: Iterable[tuple[str, nn.Module]]) -> None:
        """Plain tensor attributes of modules (not registered buffers) are constants with a name;
        looked for only once a tensor of unknown origin shows up, which most models never do."""
        self._attributes_scanned = True
        for path, m in modules:
            for attr, v in vars(m).items():
                if isinstance(v, torch.Tensor) and self._known(v) is None \
                        and (self._made is None or self._made(v) is None):
                    self._names[id(v)] = (v, "constant", f"{path}.{attr}" if path else attr)

    def _known(self, t: torch.Tensor) -> tuple[NodeKind, str] | None:
        e = self._names.get(id(t))
        return (e[1], e[2]) if e is not None and e[0] is t else None

    def _backup(self, t: torch.Tensor) -> None:
        if id(t) not in self._backed:
            self._backed.add(id(t))
            with torch.no_grad():
                self._saved.append((t, t.data, t.detach().clone()))

    def before_write(self, values: Iterable[Any]) -> None:
        """A call is about to run that may write these arguments (tensors, or lists of tensors):
        copy each model tensor among them, or whose storage one of them shares, first."""
        if not self._snapshot_buffers:
            return
        for v in values:
            if isinstance(v, torch.Tensor):
                self._before_write(v)
            elif isinstance(v, (list, tuple)):
                for x in v:
                    if isinstance(x, torch.Tensor):
                        self._before_write(x)

    def _before_write(self, t: torch.Tensor) -> None:
        if self._known(t) is not None:
            self._backup(t)
            return
        if t.is_meta or type(t) not in (torch.Tensor, nn.Parameter):
            return
        if self._by_storage is None:
            if not self._attributes_scanned:
                self._scan_attributes(self._modules)
            self._by_storage = {}
            for tensor, _, _ in self._names.values():
                # a DTensor's (subclass) storage has no data pointer: only plain tensors share storage
                if not tensor.is_meta and type(tensor) in (torch.Tensor, nn.Parameter):
                    self._by_storage.setdefault(tensor.untyped_storage().data_ptr(), tensor)
        owner = self._by_storage.get(t.untyped_storage().data_ptr())
        if owner is not None:
            self._backup(owner)

    def before_backward(self) -> None:
        """``backward`` is about to run: copy the gradients it may accumulate into."""
        if self._grads_saved or not self._snapshot_buffers:
            return
        self._grads_saved = True
        for _, m in self._modules:
            for p in m._parameters.values():
                if p is not None and p.grad is not None:
                    self._backup(p.grad)

    def restore(self) -> None:
        """Put back what the forward wrote of what was copied: a capture leaves the model as it
        found it. Through ``.data`` and only where a value differs, so the tensors' version
        counters do not move (an autograd graph the user holds stays valid). Written into the
        elements copied from, by their alias: a tensor the forward rebound (``w.data = w.data.t()``)
        gets its elements back from the snapshot (:class:`fxviz.torchbridge.guard.ModelState`),
        and writing the copy into its new layout would scramble them."""
        with torch.no_grad():
            for _, alias, saved in self._saved:
                if not torch.equal(alias, saved):
                    alias.copy_(saved)
        self._saved.clear()
        self._backed.clear()


#: :data:`Place`'s first item: the address is that of the elements, or of a storage without any
DATA, NO_DATA = 0, 1
#: where a tensor's elements are (:func:`place`)
Place = tuple[int, int, int, tuple[int, ...], tuple[int, ...]]


def place(t: torch.Tensor) -> Place | None:
    """Where a tensor's elements are: its storage's address, offset, shape and strides. A storage
    without elements (``meta``, where every data pointer is 0; a fake tensor's, whose data pointer
    torch warns about) is told by its own address instead (the recorder holds it while recording:
    a LLaMA-70B shape sharded on meta reads each column-parallel output through ``to_local``)."""
    try:
        storage = t.untyped_storage()
        if type(t) is FakeTensor or t.is_meta:
            return (NO_DATA, storage._cdata, int(t.storage_offset()), tuple(t.shape), tuple(t.stride()))
        ptr = storage.data_ptr()
    except (RuntimeError, NotImplementedError):
        return None
    return (DATA, ptr, int(t.storage_offset()), tuple(t.shape), tuple(t.stride())) if ptr else None


__all__ = [
    "CPU_METAS", "DATA", "METAS", "NO_DATA", "ModelTensors", "Place", "TensorMap", "Versions", "add_output", "place",
    "tensor_meta", "version",
]
