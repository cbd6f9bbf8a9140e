"""The values a trace starts from: model inputs, and the parameter, buffer, constant and FSDP2 nodes
made the first time an op reads a tensor no op made (:class:`StateValues`, the base of
:class:`~fxviz.fallback.recorder.Recorder`, which sets every attribute declared here).

DTensors and their local shards are one value to the graph (:meth:`StateValues._local_value`), and
FSDP2's shards, gathered buffers and unsharded parameters are named after the parameter they hold
(:mod:`fxviz.fallback.fsdp`).
"""

from __future__ import annotations

import sys
from typing import Any
from weakref import ref as _weakref

import torch
from torch import nn

from fxviz.fallback.context import ModuleStack, Names
from fxviz.fallback.fsdp import FsdpParams, shard_attrs, unsharded_source
from fxviz.fallback.observe import PLAIN_TENSORS
from fxviz.fallback.tensors import METAS, NO_DATA, ModelTensors, Place, Versions, place, tensor_meta, version
from fxviz.ir import Node, NodeKind, Ref
from fxviz.torchbridge.distributed import placement_attrs

_PLAIN_TENSORS = PLAIN_TENSORS


class StateValues:
    """Where a tensor read by an op comes from, when no op of the trace made it."""

    nodes: list[Node]
    modules: list[tuple[str, nn.Module]]
    module_stack: ModuleStack
    names: Names
    versions: Versions
    state: ModelTensors
    replay_blockers: list[str]
    placements: dict[Any, Any]
    _values: Any  # versions.values
    _sharded: dict[Place, Ref]
    _held: list[Any]
    _fsdp: FsdpParams | None
    _by_path: dict[str, nn.Module] | None
    _shared_modules: bool

    # ---- values the graph starts from ----------------------------------------------------------

    def add_input(self, name: str, t: torch.Tensor) -> None:
        node = Node(self.names.unique(name), "input", target=name, outputs=(tensor_meta(t),), attrs=self.sharded_attrs(t))
        self.nodes.append(node)
        self._values[t] = [Ref(node.name), version(t)]
        if node.attrs:  # a DTensor: an op on its shard (a parallel style's redistribution of it) reads the input
            self._note_sharded(t, Ref(node.name))

    def sharded_attrs(self, t: torch.Tensor) -> dict[str, str]:
        """A model input's or output's placement on its device mesh where it is a DTensor
        (:func:`~fxviz.torchbridge.distributed.placement_attrs`), else nothing."""
        return placement_attrs(t, self.placements) if type(t) not in _PLAIN_TENSORS and hasattr(t, "placements") else {}

    def read(self, t: torch.Tensor) -> Ref:
        """The node output a tensor comes from, creating its parameter, buffer or constant node on
        first read."""
        return self.read_at(t, version(t))

    def read_at(self, t: torch.Tensor, v: int) -> Ref:
        ref = self.versions.lookup(t, v)
        if ref is None and (self._sharded or type(t) not in _PLAIN_TENSORS):
            ref = self._sharded_value(t)
        return ref if ref is not None else self._state_node(t)

    def _sharded_value(self, t: torch.Tensor) -> Ref | None:
        """The value a DTensor (or a shard of one) read for the first time is: FSDP2's unsharded
        DTensor parameter (2-D, FSDP over tensor parallel) by name, else :meth:`_local_value`."""
        if self._fsdp is not None:
            ref = self._fsdp_node(t)
            if ref is not None:
                return ref
        return self._local_value(t)

    def _local_value(self, t: torch.Tensor) -> Ref | None:
        """A DTensor and its local shard are one value to the graph: DTensor's ``from_local`` and
        ``to_local`` run as autograd Functions the torch-function mode does not see, so the DTensor
        (or shard) the next op reads was never an op's output. The DTensor wraps a recorded shard
        (``_local_tensor``); a shard is a view of a recorded DTensor's ``_local_tensor`` (same
        storage, offset, shape and strides)."""
        local = getattr(t, "_local_tensor", None)
        if isinstance(local, torch.Tensor):
            ref = self.versions.lookup(local, version(local))
            if ref is not None:
                return ref
            t = local  # a new DTensor around a recorded one's shard or a view of it (a redistribution)
        where = place(t)
        return self._sharded.get(where) if where is not None else None

    def _note_sharded(self, out: torch.Tensor, ref: Ref) -> None:
        local = getattr(out, "_local_tensor", None)
        if isinstance(local, torch.Tensor):
            key = place(local)
            if key is not None:
                self._sharded[key] = ref
                if key[0] == NO_DATA:
                    self._held.append(local.untyped_storage())

    def _state_node(
        self, t: torch.Tensor, kind: NodeKind | None = None, name: str = "", *, base: str = "",
        inputs: tuple[Ref, ...] = (), attrs: dict[str, Any] | None = None, owner: str | None = None,
    ) -> Ref:
        """The node of a tensor read for the first time that no op made: what the model calls it
        (``kind`` and ``name`` given: FSDP2's, :meth:`_fsdp_node`, with the node's name ``base``,
        its ``inputs`` and ``attrs``, and the module ``owner`` when the name does not say it)."""
        if kind is None:
            e = self.state._names.get(id(t))
            if e is not None and e[0] is t and e[1] == "parameter":  # ModelTensors.read, inlined for a parameter
                kind, name = "parameter", e[2]
            else:
                kind, name = self.state.read(t)
                if not name:
                    ref = self._fsdp_node(t)
                    if ref is not None:
                        return ref
                    kind, name = self._swapped_in(t)
                if not name:
                    self.replay_blockers.append("reads a tensor the model does not own (a global or a closure)")
        if owner is None:
            owner = name.rpartition(".")[0]
        meta = METAS.get((t.shape, t.dtype, t.device))  # tensor_meta(), inlined: once per parameter
        names = self.names  # Names.unique(), inlined for a name not taken yet
        base = base or name or "constant"
        if base in names._next or base in names._taken:
            base = names.unique(base)
        else:
            names._next[base] = 1
            names._taken.add(base)
        node = Node(
            base, kind, name, inputs, ((owner, 0),) if owner else (),
            (meta if meta is not None else tensor_meta(t),), attrs=attrs if attrs is not None else self.sharded_attrs(t),
        )
        self.nodes.append(node)
        ref = Ref(node.name)
        try:
            v = t._version
        except RuntimeError:  # an inference tensor
            v = 0
        self._values._d[id(t)] = (_weakref(t), [ref, v])  # TensorMap.__setitem__, inlined
        return ref

    def _fsdp_node(self, t: torch.Tensor) -> Ref | None:
        """FSDP2's shard of a parameter (``fsdp::all_gather_copy_in`` reads it), or its unsharded
        parameter, which reads the gathered bytes it is a view of (:mod:`fxviz.fallback.fsdp`)."""
        if self._fsdp is None:
            if "torch.distributed.fsdp" not in sys.modules:  # no FSDP2 unit exists
                return None
            self._fsdp = FsdpParams(self.modules)
        found = self._fsdp.find(t)
        if found is None:
            return None
        role, p, name = found
        if role == "shard":
            return self._state_node(t, "parameter", name, base=f"{name}.shard", attrs=shard_attrs(p, name))
        if role == "gathered":  # the buffer FSDP2 copies the gathered bytes out into: made before a later step
            return self._state_node(t, "constant", f"{name}.all_gather_output", owner=name.rpartition(".")[0],
                                    attrs={"all_gather_output_of": name})
        # a DTensor (FSDP2 over tensor parallel) wraps a view the tracer may have recorded
        src = None if type(t) in _PLAIN_TENSORS else self._local_value(t)
        src = src or unsharded_source(p, self.nodes, lambda x: self.versions.lookup(x, version(x)))
        return self._state_node(t, "parameter", name, inputs=(src,) if src is not None else (),
                                attrs=None if type(t) in _PLAIN_TENSORS else placement_attrs(t))

    def _swapped_in(self, t: torch.Tensor) -> tuple[NodeKind, str]:
        """A parameter or buffer a running module holds now but did not when the capture began
        (FSDP2 swaps its unsharded parameters in before each forward): its name; else a constant."""
        if self._by_path is None:
            self._by_path = dict(self.modules)
        for path, _ in reversed(self.module_stack.current):
            m = self._by_path.get(path)
            for kind, table in (("parameter", m._parameters), ("buffer", m._buffers)) if m is not None else ():
                for attr, v in table.items():
                    if v is t:
                        return kind, f"{path}.{attr}"  # type: ignore[return-value]
        return "constant", ""

    @property
    def may_tie(self) -> bool:
        """Whether the model holds a tensor under two names (a tied weight, a module registered
        twice): only then has :func:`~fxviz.torchbridge.values.mark_tied` anything to do."""
        return self._shared_modules or self.state.tied

