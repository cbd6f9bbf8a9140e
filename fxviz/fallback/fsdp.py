"""FSDP2's parameters as the graph names them: the tensors ``fully_shard`` reads and swaps in are not
the ones the capture began with, so the recorder asks the model's own ``FSDPParam`` objects.

Before a unit's forward FSDP2 all-gathers each parameter's shard (``_sharded_param_data``, read by
``fsdp::all_gather_copy_in``: a flat, padded view of the sharded DTensor parameter's local tensor),
copies the gathered bytes out (``fsdp::split_with_sizes_copy``) into ``all_gather_outputs`` and
swaps in ``_unsharded_param``, a view of those bytes. The graph says so: the shard is a parameter
node named ``<name>.shard`` (target the parameter's name; ``shard_of`` the unsharded parameter it
is gathered into, which alone counts among the model's parameters; :func:`shard_attrs`), and the
unsharded parameter, named as the module holds it, reads the value it is a view of: the
``as_strided`` FSDP2 made it from (a unit's first forward) or the copy-out's output; over tensor
parallel, the DTensor FSDP2 wrapped that view in (:func:`name_unsharded`). In a training step the
gradient outputs are named by these parameters and each unit's reduce-scatter reads them
(:func:`unsharded_names`, :func:`reduced_grads`).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from fxviz.fallback.tensors import tensor_meta
from fxviz.ir import Node, Ref
from fxviz.torchbridge.distributed import format_placement, placement_attrs
from fxviz.torchbridge.fsdpstate import FsdpState, param_groups


class FsdpParams:
    """The model's ``FSDPParam`` objects, found by the tensors of theirs that an op reads.

    Looked for only when a tensor of unknown origin is read; the table is made on the first such
    read and made again when FSDP2 replaced a parameter's tensors since (its lazy init does)."""

    def __init__(self, modules: list[tuple[str, nn.Module]]) -> None:
        self._modules = modules
        self._params: list[Any] | None = None  # every FSDPParam, in module order
        self._by_id: dict[int, tuple[torch.Tensor, str, Any]] = {}  # id -> (tensor, role, FSDPParam)
        self._names: dict[int, str] = {}  # id(FSDPParam) -> its parameter's name

    def find(self, t: torch.Tensor) -> tuple[str, Any, str] | None:
        """``(role, fsdp_param, name)`` for a shard's data (role ``shard``), an unsharded
        parameter (``unsharded``) or the buffer the gathered bytes are copied out into
        (``gathered``) of the model's FSDP2 units; None for any other tensor."""
        if self._params is None:
            self._build()
        e = self._by_id.get(id(t))
        if (e is None or e[0] is not t) and self._params and self._stale():
            self._build()
            e = self._by_id.get(id(t))
        if e is None or e[0] is not t:
            return None
        return e[1], e[2], self._names[id(e[2])]

    def unsharded_dtensors(self) -> list[tuple[torch.Tensor, str]]:
        """The unsharded parameters that are DTensors (FSDP2 over tensor parallel), with names. A
        plain one, real or fake (a model sharded on meta, :func:`fake_shards`), is made with no
        op the graph holds (``nn.Parameter``'s calls on a fake tensor are not recorded:
        :func:`~fxviz.fallback.observe.made_by_parameter`): its first read names it."""
        if self._params is None or self._stale():
            self._build()
        return [(e[0], self._names[id(e[2])]) for e in self._by_id.values()
                if e[1] == "unsharded" and type(e[0]) not in (torch.Tensor, nn.Parameter, FakeTensor)]

    def _stale(self) -> bool:
        return any(self._by_id.get(id(t), (None,))[0] is not t
                   for p in self._params or () for t in _tensors(p).values() if t is not None)

    def _build(self) -> None:
        paths = {id(m): path for path, m in reversed(self._modules)}  # a shared module: its first path
        self._params, self._by_id, self._names = [], {}, {}
        for _, m in self._modules:
            state = getattr(m, "_get_fsdp_state", None)
            group = getattr(state(), "_fsdp_param_group", None) if callable(state) else None
            for p in getattr(group, "fsdp_params", ()):
                self._params.append(p)
                info = p._module_info
                owner = paths.get(id(info.module))
                self._names[id(p)] = (f"{owner}.{info.param_name}" if owner else info.param_name) \
                    if owner is not None else str(p._param_fqn or info.param_name)
                for role, t in _tensors(p).items():
                    if t is not None:
                        self._by_id[id(t)] = (t, role, p)


def unsharded_names(model: nn.Module) -> dict[int, str]:
    """``id`` -> name of each FSDP2 unsharded parameter of ``model`` (the tensors its backward
    accumulates gradients into, which ``named_parameters`` does not list once FSDP2 swapped the
    sharded ones back in); empty for a model without FSDP2."""
    if not any(hasattr(m, "_get_fsdp_state") for m in model.modules()):
        return {}
    found = FsdpParams(list(model.named_modules(remove_duplicate=False)))
    found._build()
    return {id(e[0]): found._names[id(e[2])] for e in found._by_id.values() if e[1] == "unsharded"}


def reduced_grads(names: dict[int, str]) -> list[str]:
    """Inside FSDP2's ``foreach_reduce`` (a unit's gradient reduce-scatter being dispatched): the
    names of the parameters whose gradients it reduces, in FSDP2's order; ``names`` maps the sharded
    parameters the capture began with to theirs. Empty anywhere else."""
    return _in_frame("foreach_reduce", names)


def gathered_params(names: dict[int, str]) -> list[str]:
    """Inside FSDP2's ``foreach_all_gather`` (a unit's all-gather being dispatched, as its
    pre-backward hook re-gathers what ``reshard_after_forward`` freed): the names of the parameters
    it gathers, in FSDP2's order (``names`` as for :func:`reduced_grads`). Empty anywhere else."""
    return _in_frame("foreach_all_gather", names)


def _in_frame(function: str, names: dict[int, str]) -> list[str]:
    f: Any = sys._getframe(2)
    while f is not None:
        if f.f_code.co_name == function and "fsdp_params" in f.f_locals:
            return [names.get(id(p.sharded_param)) or str(p._param_fqn) for p in f.f_locals["fsdp_params"]]
        f = f.f_back
    return []


def name_unsharded(params: list[tuple[torch.Tensor, str]], nodes: list[Node], values: Any,
                   unique: Callable[[str], str]) -> None:
    """FSDP2 over tensor parallel: an unsharded parameter is a DTensor that FSDP2 made with ops the
    tracer recorded (its view of the gathered bytes, detached), so ops read it as that op's value.
    Each gets its parameter node, by name, reading that value, and its readers read the parameter.
    ``values`` is the recorder's tensor -> ``[ref, version]`` map, ``unique`` its node namer."""
    if not params:
        return
    swap: dict[Ref, Ref] = {}
    after: dict[str, Node] = {}
    named = {n.name for n in nodes if n.kind == "parameter"}  # read before it was recorded
    for t, name in params:
        e = values.get(t)
        if e is None or e[0] in swap or e[0].node in named:
            continue
        owner = name.rpartition(".")[0]
        node = Node(unique(name), "parameter", name, (e[0],), ((owner, 0),) if owner else (),
                    (tensor_meta(t),), attrs=placement_attrs(t))
        swap[e[0]], after[e[0].node] = Ref(node.name), node
        e[0] = Ref(node.name)
    if not swap:
        return
    out: list[Node] = []
    for n in nodes:
        if any(r in swap for r in n.inputs):
            n.inputs = tuple(swap.get(r, r) for r in n.inputs)
        out.append(n)
        if n.name in after:
            out.append(after[n.name])
    nodes[:] = out


def meta_shards(named: list[tuple[str, nn.Module]]) -> list[Any]:
    """The FSDP2 states of a model built on ``meta`` and sharded there (its ``FSDPParam`` objects'
    sharded parameters on ``meta``): FSDP2's lazy init refuses to run them; empty otherwise."""
    states: dict[int, Any] = {}
    for _, m in named:
        get = getattr(m, "_get_fsdp_state", None)
        state = get() if callable(get) else None
        if state is not None:
            states.setdefault(id(state), state)
    params = [p for s in states.values() for g in param_groups(s) for p in g.fsdp_params]
    return list(states.values()) if any(p.sharded_param.device.type == "meta" for p in params) else []


@contextlib.contextmanager
def fake_shards(named: list[tuple[str, nn.Module]], states: list[Any]) -> Iterator[None]:
    """Inside a ``FakeTensorMode``: each FSDP2 parameter of ``states`` that lies on ``meta`` swapped
    for a fake one of the same shard on its mesh's device (no memory: what ``to_empty`` would make, fake), so FSDP2's
    lazy init, all-gathers and copy-outs run as on a materialised model, and in a training step its
    backward's re-gathers and gradient reduce-scatters (entered around the whole step: see
    :class:`~fxviz.fallback.trace.FakeRun`). Afterwards the model's
    parameters and FSDP2's state are put back as they were: the same ``meta`` parameters, FSDP2 not
    initialised, no fake tensor left in the model (the user may still ``to_empty`` and train it)."""
    from torch.distributed.tensor import DTensor

    groups = [g for s in states for g in param_groups(s)]
    params = [p for g in groups for p in g.fsdp_params]
    kept = FsdpState(states)
    slots = [(m, dict(m._parameters)) for _, m in named]
    try:
        with torch.no_grad():
            for p in params:
                old = p.sharded_param
                if old.device.type != "meta":
                    continue
                local = old._local_tensor
                # on the mesh's device: FSDP2 gathers there (a CUDA mesh's copy-in is on the GPU)
                fake = torch.empty_strided(local.shape, local.stride(), dtype=local.dtype,
                                           device=old.device_mesh.device_type)
                new = nn.Parameter(DTensor(fake, old._spec, requires_grad=old.requires_grad),
                                   requires_grad=old.requires_grad)
                info = p._module_info
                for m, name in ((info.module, info.param_name),
                                *zip(info.shared_modules, info.shared_param_names, strict=True)):
                    m._parameters[name] = new
                p.reset_sharded_param()
            for g in groups:  # done, as FSDP2's lazy init would (it would make the shards again)
                g._reset_sharded_params = True
        yield
    finally:
        kept.restore()
        for m, d in slots:
            m._parameters.clear()
            m._parameters.update(d)


def _tensors(p: Any) -> dict[str, torch.Tensor | None]:
    outs: list[Any] = getattr(p, "all_gather_outputs", None) or []
    return {"shard": getattr(p, "_sharded_param_data", None), "unsharded": getattr(p, "_unsharded_param", None),
            "gathered": outs[0] if len(outs) == 1 else None}


def shard_attrs(p: Any, name: str) -> dict[str, Any]:
    """A shard's node attrs: the unsharded parameter it gathers into (``shard_of``), and how the
    sharded DTensor parameter lies on the mesh: ``shard_placements`` (``S(0)``), ``mesh``, and
    ``shard_shape``, this rank's piece before FSDP2 padded and flattened it. Not ``placements``:
    beside a shape that names a DTensor's global shape, and this value is one rank's."""
    sharded = p.sharded_param
    where = format_placement(tuple(sharded.placements), sharded.device_mesh)
    local = getattr(sharded, "_local_tensor", sharded)
    return {"shard_of": name, "shard_placements": where["placements"], "mesh": where["mesh"],
            "shard_shape": [int(d) for d in local.shape]}


def unsharded_source(p: Any, nodes: list[Node], lookup: Any) -> Ref | None:
    """The value an unsharded parameter is a view of: the ``as_strided`` of the copy-out's output
    that FSDP2 made it from, when this capture saw it (a unit's first forward), else that output."""
    outs: list[Any] = getattr(p, "all_gather_outputs", None) or []
    if len(outs) != 1 or not isinstance(outs[0], torch.Tensor):
        return None
    ref: Ref | None = lookup(outs[0])
    if ref is None:
        return None
    shape = tuple(p._unsharded_param.shape)
    for n in reversed(nodes):  # made after the copy-out, in the unit's pre-forward
        if n.name == ref.node:
            break
        if n.inputs[:1] == (ref,) and "as_strided" in n.target.split(".") \
                and len(n.outputs) == 1 and tuple(n.outputs[0].shape) == shape:
            return Ref(n.name)
    return ref


__all__ = ["FsdpParams", "fake_shards", "gathered_params", "meta_shards", "name_unsharded", "reduced_grads", "shard_attrs", "unsharded_names", "unsharded_source"]
