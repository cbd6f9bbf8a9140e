"""A capture's fake process group leaves nothing of its own behind (issue 22, must hold): the
process-group state, the default group, DTensor's caches of the meshes it built, and the
process's next group, in which the user's own sharded model runs as torch runs it.

DTensor caches what it derives from a spec (its sharding propagation, the redistribution's plans)
process-wide, keyed by ``DeviceMesh``, whose equality ignores the mesh's process groups: after a
capture, an equal mesh in the user's next group got back the capture's mesh, bound to group names
that group had registered ("Could not resolve the process group registered under the name 5")."""

from __future__ import annotations

import gc
from typing import Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.debug import CommDebugMode

import fxviz
from fxviz.fallback.comms import _kind
from fxviz.torchbridge.distributed import end_world
from tests.test_distributed import sp_factory, waited


def _users_run(other_groups: int) -> dict[str, dict[str, int]]:
    """The user's own world of 8 ranks: ``other_groups`` groups made first (their names come
    before the mesh's), then the sequence-parallel decoder run under ``CommDebugMode``: torch's
    own counts per module and collective kind."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    try:
        for r in range(other_groups):
            dist.new_group([2 * r, 2 * r + 1])
        model, args = sp_factory()
        with CommDebugMode() as mode:
            waited(model(*args))
        return {k: {_kind(str(op)): n for op, n in v["forward"].items() if n} for k, v in mode.comm_module_counts.items()}
    finally:
        end_world()


def test_the_users_own_world_after_captures_runs_as_one_never_preceded_by_them() -> None:
    """Two captures of the decoder in fxviz's group, then the user's group whose mesh is equal to
    the capture's but has other group names: torch's own record of the user's run is the one it
    gives where no capture came before (the same run first in the process: one all-gather and
    reduce-scatter per sequence-parallel boundary, per module). It raised in torch, on a group name
    of the capture's group."""
    want = _users_run(2)
    assert sum(want["Global"].values()) == 9 and want["Global"].keys() == {"all_gather", "reduce_scatter"}
    for backward in (False, True):
        fxviz.capture(sp_factory, world_size=8, backward=backward)
    assert _users_run(2) == want
    assert _users_run(0) == want  # and with the capture's group names, as before


def _meshes() -> set[int]:
    gc.collect()
    return {id(o) for o in gc.get_objects() if isinstance(o, DeviceMesh)}


def _world() -> dict[str, Any]:
    """The process-group state torch keeps (``_world``) and the default group."""
    w = c10d._world
    return {"initialized": dist.is_initialized(), "default": w.default_pg, "groups": dict(w.pg_map),
            "names": dict(w.pg_names), "count": w.group_count, "ranks": dict(w.pg_group_ranks),
            "tags": dict(w.tags_to_pg), "backends": dict(w.pg_backend_config)}


def _cache_sizes() -> dict[str, int]:
    """The entries of DTensor's Python caches keyed by meshes (its C++ sharding cache has no size)."""
    from torch.distributed.tensor import DTensor, _redistribute
    from torch.distributed.tensor._collective_utils import MeshTopoInfo

    prop = DTensor._op_dispatcher.sharding_propagator
    return {"sharding": prop.propagate_op_sharding.cache_info().currsize,
            "meta": prop._propagate_tensor_meta_cached.cache_info().currsize,
            "plans": _redistribute._gen_transform_infos.cache_info().currsize,
            "planners": len(_redistribute._planner_cache),
            "topology": MeshTopoInfo.build_from_mesh.cache_info().currsize}


def test_a_capture_leaves_the_process_group_state_and_no_mesh_behind() -> None:
    """After ``capture(..., world_size=8)`` (forward, and with the backward): torch's process-group
    state is what it was, no default group, and no mesh the capture built is alive (DTensor's
    caches held them, and the model the factory built was freed)."""
    fxviz.capture(sp_factory, world_size=8)  # torch's lazy state, made once per process
    before, meshes = _world(), _meshes()
    for backward in (False, True):
        fxviz.capture(sp_factory, world_size=8, backward=backward)
        assert _world() == before and not before["initialized"] and before["default"] is None
        assert _meshes() <= meshes
        assert set(_cache_sizes().values()) == {0}


def test_a_capture_in_the_callers_group_leaves_its_caches_alone() -> None:
    """In a group the caller made, the capture's meshes are the caller's, valid as long as the
    group is: DTensor's caches keep what the caller's run and the capture filled, and the group
    stays initialised, the caller's."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    try:
        group = c10d._get_default_group()
        model, args = sp_factory()
        waited(model(*args))
        filled = _cache_sizes()
        assert filled["plans"] > 0 and filled["planners"] > 0
        fxviz.capture(model, args)
        after = _cache_sizes()
        assert all(after[k] >= n for k, n in filled.items())
        assert dist.is_initialized() and c10d._get_default_group() is group
    finally:
        end_world()
    assert not dist.is_initialized() and set(_cache_sizes().values()) == {0}

