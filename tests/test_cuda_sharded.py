"""Sharded models on a CUDA device, in torch's fake process group (issue 22 on the GPU): a
tensor-parallel block's collectives and an FSDP2 training step's reduce-scatters per module, as
``CommDebugMode`` counts them on the same model; a tensor-parallel MLP compiled by Inductor (Triton
kernels) with its collectives on the post-grad nodes torch's ``cppCodeToPost`` gives them; and
Inductor's communication passes (bucketing, the scheduler's reordering) read from torch's own
records of a CUDA compile. The CPU tests of the same facts run their checks here on ``cuda`` models.

These need a GPU: ``pytest -m cuda`` on a machine with one; deselected where torch sees none.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import fxviz
from fxviz.passes.comm import collectives
from tests import test_distributed as td
from tests import test_distributed_backward as tb
from tests import test_distributed_fsdp as tf
from tests import test_distributed_fsdp_meta as tfm
from tests import test_inside_comms as tc
from tests import test_inside_sharded as ts

pytestmark = [pytest.mark.cuda, pytest.mark.slow]


def tp_block_cuda() -> tuple[Any, tuple[Any, ...]]:
    mesh = init_device_mesh("cuda", (dist.get_world_size(),))
    plan = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "o": RowwiseParallel(),
            "mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel()}
    torch.manual_seed(0)
    return parallelize_module(td.Block().cuda(), mesh, plan), (torch.randn(2, 5, 32, device="cuda"),)


def tp_mlp_cuda() -> tuple[Any, tuple[Any, ...]]:
    mesh = init_device_mesh("cuda", (dist.get_world_size(),))
    torch.manual_seed(0)
    m = parallelize_module(td.MLP().cuda(), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    return m, (torch.randn(4, 16, device="cuda"),)


def fsdp_gpt_cuda() -> tuple[Any, tuple[Any, ...]]:
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cuda", (dist.get_world_size(),), mesh_dim_names=("dp",))
    torch.manual_seed(0)
    m = tf.GPT().cuda()
    for block in m.h:
        fully_shard(block, mesh=mesh)
    fully_shard(m, mesh=mesh)
    return m, (torch.randint(0, 40, (2, 8), device="cuda"),)


def test_a_tensor_parallel_block_on_the_gpu_has_the_collectives_comm_debug_mode_counts() -> None:
    g = fxviz.capture(tp_block_cuda, world_size=4)  # 4 ranks: one head of 8 each
    assert td.counts(g) == td.oracle(tp_block_cuda, 4)
    devices = {m.device for n in g.nodes if n.kind == "op" for m in n.outputs if m.is_tensor}
    assert devices == {"cuda"}, devices


def test_an_fsdp2_step_on_the_gpu_reduce_scatters_per_unit_as_comm_debug_mode_counts() -> None:
    g = fxviz.capture(fsdp_gpt_cuda, world_size=8, backward=True)
    want = tb.oracle(fsdp_gpt_cuda, 8)
    scatters = [r for r in collectives(g) if r["kind"] == "reduce_scatter"]
    assert len(scatters) == want[""]["backward"]["reduce_scatter"] == 3
    paths = ["", "h.0", "h.1"]
    assert {p: tb.counts(g)[p] for p in paths} == {p: want[p] for p in paths}


def test_a_tensor_parallel_mlp_compiled_to_triton_maps_its_collectives() -> None:
    run = ts.compiled(tp_mlp_cuda)
    ts.test_collectives_of_a_compiled_tensor_parallel_mlp(run)
    cm = run[0]
    g = cm.inside.graphs[0]
    assert any(k.kind == "triton" for k in g.kernels), [(k.id, k.kind) for k in g.kernels]
    assert g.mapped == g.ops


@pytest.fixture(scope="module")
def comms() -> tuple[Any, dict[str, list[Any]]]:
    return tc.compiled("cuda")


def test_inductors_all_gather_bucket_on_the_gpu_is_the_post_grad_stage_change(comms) -> None:
    tc.test_the_bucket_torch_formed_is_the_post_grad_stage_change(comms)


def test_the_wait_inductors_scheduler_sank_on_the_gpu_is_moved(comms) -> None:
    tc.test_the_wait_the_scheduler_sank_is_moved_in_the_kernels_stage(comms)


def fsdp_meta_cuda() -> tuple[Any, tuple[Any, ...]]:
    """The model too big to load, as training code shards it for GPUs: built on ``meta``, a CUDA mesh."""
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cuda", (dist.get_world_size(),), mesh_dim_names=("dp",))
    with torch.device("meta"):
        m = tf.GPT()
    for block in m.h:
        fully_shard(block, mesh=mesh)
    fully_shard(m, mesh=mesh)
    return m, (torch.randint(0, 40, (2, 8), device="cuda"),)


def test_an_fsdp2_model_sharded_on_meta_for_a_cuda_mesh_captures_as_the_materialised_one() -> None:
    made: list[Any] = []

    def factory() -> tuple[Any, tuple[Any, ...]]:
        m, args = fsdp_meta_cuda()
        made.append(m)
        return m, args

    g = fxviz.capture(factory, world_size=8)
    assert g.error is None and "fake" in g.method
    assert td.counts(g) == td.oracle(fsdp_gpt_cuda, 8)  # CommDebugMode on the same model, on the GPU
    for path, params in tf.units(made[0]):
        record = next(r for r in collectives(g) if r["module"] == path)
        assert record["bytes"] == sum(p._sharded_param_data.numel() * 4 for p in params)
    assert all(p.is_meta for p in made[0].parameters())  # left as it was: nothing materialised


def test_a_training_step_of_an_fsdp2_model_sharded_on_meta_for_a_cuda_mesh_equals_the_gpu_step() -> None:
    """``backward=True`` on the meta model of a CUDA mesh: forward and backward on fake CUDA shards;
    collectives per unit (both phases) equal ``CommDebugMode`` on the same model on the GPU, the
    reduce-scatters' bytes the real GPU step's, and the re-gathered parameters are read as there."""
    made: list[Any] = []

    def factory() -> tuple[Any, tuple[Any, ...]]:
        m, args = fsdp_meta_cuda()
        made.append(m)
        return m, args

    g = fxviz.capture(factory, world_size=8, backward=True)
    assert g.error is None and g.method == "eager (fake) (backward)"
    want = tb.oracle(fsdp_gpt_cuda, 8)
    paths = ["", "h.0", "h.1"]
    assert {p: tb.counts(g)[p] for p in paths} == {p: want[p] for p in paths}
    scatters = [r["bytes"] for r in collectives(g) if r["kind"] == "reduce_scatter"]
    assert scatters == tfm._scattered(fsdp_gpt_cuda, 8)
    devices = {m.device for n in g.nodes if n.kind == "op" for m in n.outputs if m.is_tensor}
    assert devices == {"cuda"}, devices
    _, read = tb._read_again(fsdp_gpt_cuda, 8)
    fed = {p for n in g.nodes for r in n.inputs if "gathers_of" in g.node(r.node).attrs
           for p in [g.node(r.node).attrs["gathers_of"][r.index]] if n.phase == "backward"}
    assert fed == set(read)
    assert all(p.is_meta for p in made[0].parameters())  # left as it was: nothing materialised
