"""A fake process group for capturing sharded models in one process, without a cluster.

:func:`fake_world` runs code inside ``dist.init_process_group("fake", store=FakeStore(), rank=0,
world_size=N)`` (torch's own fake backend: collectives return at once, no network), so a factory can
call ``init_device_mesh("cpu", ...)``, ``parallelize_module`` and ``fully_shard`` as real training
code does. Only what it created is destroyed: a group the caller made is left alone.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from fxviz.errors import TargetError
from fxviz.torchbridge.normalize import flatten_outputs


@contextlib.contextmanager
def fake_world(world_size: int) -> Iterator[bool]:
    """Run the body inside a fake process group of ``world_size`` ranks (this process is rank 0).

    Yields whether this call created the group. When a default group already exists it is used as
    it is (its world size must match) and left initialised afterwards."""
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise TargetError(f"world size {world_size!r} is not a positive whole number of ranks")
    if not dist.is_available():
        raise TargetError("this torch build has no torch.distributed: capture without world_size")
    if dist.is_initialized():
        have = dist.get_world_size()
        if have != world_size:
            raise TargetError(f"a process group of world size {have} is already initialised; "
                              f"pass world_size={have} or destroy it first")
        yield False
        return
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield True
    finally:
        end_world()


def end_world() -> None:
    """Destroy the default process group, and with it what DTensor keeps of the group's meshes.

    DTensor caches what it derives from its specs in process-wide caches keyed by ``DeviceMesh``,
    whose equality and hash are its ranks, layout and dimension names, not its process groups: the
    sharding propagation's (its C++ fast path's and its Python ``lru_cache``'s cached output specs
    hold the mesh of the run that filled them), the tensor meta propagation's, the redistribution
    planner's and its transform plans, and the mesh topology of its cost model. In the next group of
    the process, a mesh equal to one of this group's hits those entries and gets this group's mesh
    back: its collectives go to group names this group registered, which are gone ("Could not
    resolve the process group registered under the name 11") or, reused, another group's. They are
    cleared whole (torch clears them no other way): no group existed before this one (fxviz makes
    its group only where none is), so each entry belongs to this group or to one already destroyed."""
    if dist.is_initialized():
        dist.destroy_process_group()
    dtensor: Any = sys.modules.get("torch.distributed.tensor")
    if dtensor is None:  # no DTensor ran: nothing cached
        return
    import torch
    from torch.distributed.tensor import _collective_utils, _redistribute

    propagator = dtensor.DTensor._op_dispatcher.sharding_propagator
    clears = (
        lambda: torch._C._clear_DTensor_sharding_propagator_cache(),
        lambda: propagator.propagate_op_sharding.cache_clear(),
        lambda: propagator._propagate_tensor_meta_cached.cache_clear(),
        lambda: _redistribute._gen_transform_infos.cache_clear(),
        lambda: _redistribute.clear_redistribute_planner_cache(),
        lambda: _collective_utils.MeshTopoInfo.build_from_mesh.cache_clear(),
    )
    for clear in clears:  # torch's private names: one a later torch renamed must not fail the capture's end
        with contextlib.suppress(AttributeError):  # (tests/test_distributed_worlds.py checks each on this torch)
            clear()



#: torch's words for a device mesh larger than the group (``init_device_mesh``), with its size
_MESH_TOO_BIG = re.compile(r"bigger than default world size (\d+), but found (\d+) ranks")
#: torch's words for a factory that needs a GPU this process does not have
_NO_GPU = re.compile(r"not compiled with (CUDA|ROCm)|no (CUDA|NVIDIA) (GPUs are available|driver)|"
                     r"Found no NVIDIA driver|nccl|has no attribute '_cuda_", re.I)


def made_group_hint(e: BaseException) -> str:
    """The hint for a factory that initialises the default process group itself, as training code
    does, in the group fxviz made before calling it (a fake one, or a torchrun launch's)."""
    if "default process group twice" not in str(e) or not dist.is_initialized():
        return ""
    made = "a fake one" if dist.get_backend() == "fake" else f"the launch's, {dist.get_backend()}"
    return (f"; fxviz made the process group before calling the factory ({made}, {dist.get_world_size()} "
            "ranks): call init_process_group only where dist.is_initialized() is false")


def fake_world_hint(e: BaseException) -> str:
    """What to do about a factory that failed in a fake process group (``""`` where nothing
    fits): a mesh larger than the group asks for its size, a factory that needs a GPU is told the
    fake group runs on the CPU (and ``meta``), one that makes its own group is told that fxviz
    made one (:func:`made_group_hint`)."""
    text = str(e)
    made = made_group_hint(e)
    if made:
        return made
    big = _MESH_TOO_BIG.search(text)
    if big:
        return f"; its mesh has {big.group(2)} ranks: pass --world-size {big.group(2)} (world_size={big.group(2)})"
    if _NO_GPU.search(text):
        return ("; the fake process group runs in this process, on its CPU: build the mesh with "
                "init_device_mesh('cpu', ...) and the model on the CPU (or under torch.device('meta') "
                "for one too big), or launch it with torchrun where the GPUs are")
    return ""


#: The variables a launcher (torchrun) sets for each process it starts.
_LAUNCHED = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
#: How long a collective may wait for the other ranks (``FXVIZ_COLLECTIVE_TIMEOUT``, seconds).
TIMEOUT_S = 600.0


def launched_world_size() -> int | None:
    """The number of ranks a launcher (``torchrun``) started this process among, from the
    environment it sets; ``None`` when this process was not launched so (or alone)."""
    if not all(k in os.environ for k in _LAUNCHED):
        return None
    size = int(os.environ["WORLD_SIZE"])
    return size if size > 1 else None


@contextlib.contextmanager
def launched_world() -> Iterator[int]:
    """Join the process group of a ``torchrun`` launch (gloo on the CPU, rendezvous from the
    environment; a group the caller already made is used as it is) and yield this rank. A
    collective that waits longer than ``FXVIZ_COLLECTIVE_TIMEOUT`` seconds (default
    :data:`TIMEOUT_S`) fails with the group's timeout. The group is destroyed after when this call
    made it."""
    made = not dist.is_initialized()
    if made:
        dist.init_process_group("gloo", timeout=timedelta(seconds=_timeout_s()))
    try:
        yield dist.get_rank()
    finally:
        if made:
            end_world()


def _timeout_s() -> float:
    return float(os.environ.get("FXVIZ_COLLECTIVE_TIMEOUT", TIMEOUT_S))


#: The launch's store keys: each rank's graph, and rank 0's word that it has written them and ends.
_GRAPH_KEY, _READ_KEY = "graph/", "graphs-read"


def exchange_graphs(text: str | None, patient: bool = True) -> list[str | None] | None:
    """Every rank's ``text`` (a graph's JSON, whole or partial; ``None``: no graph), in rank order,
    on rank 0; ``None`` on the others.

    The texts go through the launch's store, not a collective: a rank whose capture hung (a
    collective another rank never issued, the classic hang) and timed out still gives its partial
    graph, so rank 0 can say where the ranks parted. Rank 0 waits for each rank's up to the
    collective timeout and a margin (``None`` for a rank that gave nothing by then); the other
    ranks wait, as long, for rank 0's process to end (it has written by then), so that a rank that
    fails does not end the launch (torchrun stops every rank when one fails) before rank 0 writes. A rank whose capture
    failed otherwise than by the timeout (``patient`` false: the model raised, and the others may
    wait for it in a collective until their timeout) waits a few seconds only.

    Not ``dist.all_gather_object`` (nor ``gather_object`` on a gloo group): a collective needs every
    rank to reach it, so a rank that died or is stuck would take every graph with it (rank 0 gets an
    exception, not the others' graphs), and a rank cannot enter it while torchrun is ending the
    launch. The store is reached through torch's public ``TCPStore``, as a client of the one that
    torchrun's rendezvous serves at ``MASTER_ADDR:MASTER_PORT`` (its agent's, or rank 0's), not
    through the default group's private one (``distributed_c10d._get_default_store``)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    store = _launch_store()
    store.set(f"{_GRAPH_KEY}{rank}", "" if text is None else text)
    deadline = time.monotonic() + (_timeout_s() + 10.0 if patient else 5.0)

    def wait(key: str) -> bool:
        try:
            store.wait([key], timedelta(seconds=max(0.1, deadline - time.monotonic())))
        except (RuntimeError, dist.DistError):  # the store's timeout (DistStoreError)
            return False
        return True

    if rank != 0:
        wait(_READ_KEY)
        return None
    out: list[str | None] = [text]
    for r in range(1, size):
        got = store.get(f"{_GRAPH_KEY}{r}").decode() if wait(f"{_GRAPH_KEY}{r}") else ""
        out.append(got or None)
    # the others go on when this process ends, after it wrote what it took: a rank that failed ends
    # the launch when it exits (torchrun stops the rest), which must not cut rank 0's output short
    atexit.register(_release, store)
    return out


def _release(store: dist.Store) -> None:
    with contextlib.suppress(RuntimeError, dist.DistError):  # the launch's store is gone: no rank waits
        store.set(_READ_KEY, "1")


def _launch_store() -> dist.Store:
    """A client of the launch's store (``MASTER_ADDR:MASTER_PORT``, where torchrun's rendezvous
    serves it), its keys under ``fxviz/<restart>/``: the store outlives a restarted launch's ranks
    (``--max-restarts``), and a graph the last attempt left must not be read as this one's."""
    client = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                           timeout=timedelta(seconds=_timeout_s() + 10.0))
    return dist.PrefixStore(f"fxviz/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", client)


def placement_attrs(t: object, cache: dict[Any, Any] | None = None) -> dict[str, str]:
    """A DTensor's placement as JSON-safe node attrs: ``placements`` (``S(0)``, ``R``, ``P(sum)``, one per
    mesh dimension, comma-separated) and ``mesh`` (its shape, with dimension names when it has them).

    ``cache`` (one recording's, dropped with it: it holds the meshes) keeps them formatted per mesh
    and placements: a sharded forward's outputs share a few, and formatting them (each placement's
    ``str``, the mesh's shape and names) cost several microseconds per DTensor op. A new dict each call."""
    placements = tuple(getattr(t, "placements", ()))
    mesh = getattr(t, "device_mesh", None)
    key = (id(mesh), placements)
    hit = cache.get(key) if cache is not None else None
    if hit is not None and hit[0] is mesh:
        return dict(hit[1])
    attrs = format_placement(placements, mesh)
    if cache is not None:
        cache[key] = (mesh, attrs)
    return dict(attrs)


def spec_attrs(spec: Any, cache: dict[Any, Any]) -> dict[str, str]:
    """:func:`placement_attrs` of a DTensor by its ``_spec`` (``DTensorSpec``), not to be written
    (shared): the spec objects of a forward's outputs are few (DTensor's sharding propagation
    caches them), and a hit by the spec itself neither calls DTensor's ``placements`` and
    ``device_mesh`` properties nor hashes each placement (Python ``__hash__`` methods)."""
    placements, mesh = spec.placements, spec.mesh
    hit = cache.get(id(spec))
    if hit is not None and hit[0] is spec and hit[1] is placements and hit[2] is mesh:
        return hit[3]  # type: ignore[no-any-return]
    placements = tuple(placements)
    key = (id(mesh), placements)
    same = cache.get(key)
    if same is not None and same[0] is mesh:
        attrs = same[1]
    else:
        attrs = format_placement(placements, mesh)
        cache[key] = (mesh, attrs)
    cache[id(spec)] = (spec, spec.placements, mesh, attrs)  # holds the spec: its id is not reused
    return attrs  # type: ignore[no-any-return]


def format_placement(placements: tuple[Any, ...], mesh: Any) -> dict[str, str]:
    """:func:`placement_attrs`' text for ``placements`` on ``mesh``."""
    shape = tuple(mesh.shape) if mesh is not None else ()
    names = getattr(mesh, "mesh_dim_names", None) if mesh is not None else None
    where = ", ".join(f"{n}={s}" for n, s in zip(names, shape, strict=False)) if names else "x".join(map(str, shape))
    return {"placements": ", ".join(_placement_text(p) for p in placements), "mesh": where}


def _placement_text(p: Any) -> str:
    """torch's own short text (``S(0)``, ``R``, ``P(sum)``), but a partial's subclass as the partial
    it is: a vocabulary-parallel embedding's ``MaskPartial`` prints its mask's whole shape
    (``MaskP(sum, torch.Size([100, 64]), 0)``); here ``P(sum)``."""
    from torch.distributed.tensor import Partial  # imported once a DTensor exists

    return f"P({p.reduce_op})" if isinstance(p, Partial) and type(p) is not Partial else str(p)


def data_alias(t: Any) -> Any:
    """``t.data``, but for a DTensor the same wrapper built directly: its ``.data`` runs DTensor's
    dispatch of ``detach`` (about 25 us a parameter, half the snapshot of a sharded model)."""
    dtensor: Any = sys.modules.get("torch.distributed.tensor")  # not imported: no DTensor exists
    if dtensor is not None and type(t) is dtensor.DTensor:
        return dtensor.DTensor(t._local_tensor, t._spec, requires_grad=False)
    return t.data


__all__ = ["data_alias", "end_world", "fake_world", "fake_world_hint", "made_group_hint", "placement_attrs", "spec_attrs", "wait_collectives"]


def wait_collectives(out: Any) -> None:
    """Wait the functional collectives whose results the model returns unwaited (a row-parallel
    layer's output): fxviz reads the outputs as their user would, and torch warns at exit about each
    collective nobody waited."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    for _, v in flatten_outputs(out):
        if isinstance(v, AsyncCollectiveTensor):
            v.trigger_wait()
