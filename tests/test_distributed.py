"""Capturing sharded models under a fake process group (issue 22 points 1, 2, 6)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

import fxviz
from fxviz.errors import TargetError
from fxviz.fallback.comms import CommRecorder, _kind
from fxviz.ir import Graph
from fxviz.passes.comm import collectives
from fxviz.passes.overlays import overlays
from fxviz.torchbridge.distributed import end_world


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(16, 64)
        self.down = nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(32, 32)
        self.k = nn.Linear(32, 32)
        self.v = nn.Linear(32, 32)
        self.o = nn.Linear(32, 32)
        self.mlp = MLPWide()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (t.view(b, s, -1, 8).transpose(1, 2) for t in (self.q(x), self.k(x), self.v(x)))
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        h = x + self.o(a.transpose(1, 2).reshape(b, s, -1))
        return h + self.mlp(h)


class MLPWide(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(32, 64)
        self.down = nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def mlp_factory():
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    m = parallelize_module(MLP(), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    return m, (torch.randn(4, 16),)


def block_factory():
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    plan = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "o": RowwiseParallel(),
            "mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel()}
    return parallelize_module(Block(), mesh, plan), (torch.randn(2, 5, 32),)


def waited(out: Any) -> Any:
    """``out``, the functional collectives it holds unwaited (a row-parallel layer's output) waited
    as a reader of them would: a test's own run of a sharded model leaves none in torch's registry
    of unwaited work, which warns about each at the process's exit."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor
    from torch.utils._pytree import tree_leaves

    for v in tree_leaves(out):
        if isinstance(v, AsyncCollectiveTensor):
            v.trigger_wait()
    return out


def oracle(factory, world_size: int) -> dict[str, dict[str, int]]:
    """CommDebugMode's own per-module counts on the same model and inputs."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        model, args = factory()
        mode = CommDebugMode()
        with mode:
            waited(model(*args))
        return {("" if k == "Global" else k.partition(".")[2]): {_kind(str(op)): n for op, n in v["forward"].items() if n}
                for k, v in mode.comm_module_counts.items()}
    finally:
        end_world()


def counts(graph: Graph) -> dict[str, dict[str, int]]:
    """Per-module counts from the graph's records, own and inherited by every ancestor (as CommDebugMode)."""
    out: dict[str, dict[str, int]] = {}
    for r in collectives(graph):
        path = r["module"]
        parts = path.split(".") if path else []
        for k in range(len(parts), -1, -1):
            prefix = ".".join(parts[:k])
            if k and not graph.calls.calls(prefix):  # a container never called (ModuleList): no module of its own
                continue
            d = out.setdefault(prefix, {})
            d[r["kind"]] = d.get(r["kind"], 0) + 1
    return out


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("bench_distributed", Path(__file__).parent.parent / "bench" / "distributed.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def sp_factory():
    """A LLaMA-shaped decoder on a 2-D mesh (dp x tp), tensor and sequence parallel over tp."""
    mesh = init_device_mesh("cpu", (2, dist.get_world_size() // 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    m = _bench().Decoder(vocab=100, d=64, layers=2, heads=8, kv=4, ff=128)
    to_replicate = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    for layer in m.layers:
        parallelize_module(layer, mesh["tp"], {
            "input_layernorm": SequenceParallel(), "self_attn": to_replicate,
            "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
            "post_attention_layernorm": SequenceParallel(), "mlp": to_replicate,
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
        })
    parallelize_module(m, mesh["tp"], {"embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
                                       "norm": SequenceParallel()})
    return m, (torch.randint(0, 100, (2, 16)),)


@pytest.mark.parametrize(("factory", "world_size"), [(mlp_factory, 8), (block_factory, 4), (sp_factory, 8)])
def test_counts_per_module_equal_comm_debug_mode(factory, world_size: int) -> None:
    assert not dist.is_initialized()
    g = fxviz.capture(factory, world_size=world_size)
    assert not dist.is_initialized()  # the group fxviz made is gone
    want = oracle(factory, world_size)
    assert counts(g) == want
    assert sum(want[""].values()) >= 1


def test_tp_mlp_one_all_reduce_with_bytes_and_overlay() -> None:
    g = fxviz.capture(mlp_factory, world_size=8)
    recs = collectives(g)
    assert [(r["kind"], r["module"]) for r in recs] == [("all_reduce", "down")]
    assert recs[0]["bytes"] == 4 * 16 * 4  # the partial (4, 16) float32 output of the rowwise layer
    assert recs[0]["source"].endswith(".py:" + recs[0]["source"].rsplit(":", 1)[1])
    node = g.node(recs[0]["node"])
    assert "all_reduce" in node.target and g.calls.of(node.name).path == "down"
    comm = overlays(g)["comm"]
    assert comm["modules"] == {g.calls.calls("down")[0].id: 256, g.calls.root.id: 256}
    assert comm["nodes"] == {node.name: 256}
    assert any("collectives on group" in n and "(8 ranks): 1, 256 bytes" in n for n in g.notes)


def test_caller_group_left_alone() -> None:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        g = fxviz.capture(mlp_factory, world_size=2)
        assert dist.is_initialized() and dist.get_world_size() == 2
        assert len(collectives(g)) == 1
        with pytest.raises(TargetError, match="already initialised"):
            fxviz.capture(mlp_factory, world_size=8)
        assert dist.is_initialized()
    finally:
        end_world()


def test_json_round_trip_keeps_collectives_and_overlay() -> None:
    g = fxviz.capture(mlp_factory, world_size=8)
    g2 = Graph.from_json(g.to_json())
    assert collectives(g2) == collectives(g)
    assert overlays(g2)["comm"]["modules"] == overlays(g)["comm"]["modules"]
    json.loads(g.to_json())


def test_bad_world_size_and_cuda_factory_are_one_line() -> None:
    def needs_two_dims():
        init_device_mesh("cpu", (3, 3))
        return MLP(), (torch.randn(2, 16),)

    def needs_cuda():
        return MLP().to("cuda"), (torch.randn(2, 16),)

    for f in (needs_two_dims, needs_cuda):
        with pytest.raises(TargetError) as e:
            fxviz.capture(f, world_size=4)
        assert "\n" not in str(e.value) and "fake process group of 4" in str(e.value)
        assert not dist.is_initialized()
    with pytest.raises(TargetError, match="positive"):
        fxviz.capture(mlp_factory, world_size=0)


def test_a_factory_that_makes_its_own_group_is_told_fxviz_made_one() -> None:
    """Training code calls ``init_process_group`` itself; in the group fxviz made, torch says only
    "trying to initialize the default process group twice!"."""
    def own_group():
        dist.init_process_group("gloo")
        return mlp_factory()

    with pytest.raises(TargetError) as e:
        fxviz.capture(own_group, world_size=4)
    assert "default process group twice" in str(e.value) and "\n" not in str(e.value)
    assert str(e.value).endswith("fxviz made the process group before calling the factory (a fake one, 4 ranks): "
                                 "call init_process_group only where dist.is_initialized() is false")
    assert not dist.is_initialized()


class Explicit(nn.Module):
    """Collectives a user writes: ``dist.all_reduce`` (a ``c10d`` op) and a functional all_gather."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        dist.all_reduce(y)
        from torch.distributed import _functional_collectives as funcol
        return funcol.all_gather_tensor(y, 0, dist.group.WORLD)


def explicit_factory():
    return Explicit(), (torch.randn(2, 8),)


def test_light_recorder_sees_c10d_ops_as_comm_debug_mode_does() -> None:
    """The recorder is no CommDebugMode (no module hooks of its own, no look at every op), yet
    counts the user's ``c10d`` and functional collectives per module exactly as it does."""
    assert not issubclass(CommRecorder, CommDebugMode)
    g = fxviz.capture(explicit_factory, world_size=4)
    assert counts(g) == oracle(explicit_factory, 4)
    recs = collectives(g)
    assert [(r["kind"], r["module"], r["group_size"], r["bytes"]) for r in recs] == [
        ("all_reduce", "", 4, 64), ("all_gather", "", 4, 64)]
    assert all(r["source"].startswith(__file__) for r in recs)  # the forward's lines, from the tracer
    assert recs[0]["source"].endswith(f":{Explicit.forward.__code__.co_firstlineno + 2}")


def test_collectives_labelled_by_mesh_dimension() -> None:
    """On the 2-D (dp, tp) mesh the sequence-parallel collectives run on the tp dimension's group,
    labelled ``tp`` (the group ``mesh.get_group("tp")`` names), with the header's totals per dimension."""
    g = fxviz.capture(sp_factory, world_size=8)
    recs = collectives(g)
    assert {r["mesh_dim"] for r in recs} == {"tp"}
    totals = g.annotations["comm_totals"]
    assert [(t["mesh_dim"], t["count"], t["bytes"]) for t in totals] == [
        ("tp", len(recs), sum(r["bytes"] for r in recs))]
    assert any(n.startswith("collectives on mesh dimension tp (group ") and "4 ranks" in n for n in g.notes)


def test_mesh_dimension_names_are_torchs() -> None:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from fxviz.fallback.comms import mesh_dims

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    try:
        mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
        m = parallelize_module(MLP(), mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        dims = mesh_dims(list(m.parameters()))
        assert dims == {mesh.get_group("dp").group_name: "dp", mesh.get_group("tp").group_name: "tp"}
        plain = parallelize_module(MLP(), init_device_mesh("cpu", (8,)), {"up": ColwiseParallel()})
        assert mesh_dims(list(plain.parameters())) == {}  # an unnamed mesh: the group's name only
    finally:
        end_world()


FACTORY = '''
import torch, torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(16, 64)
        self.down = nn.Linear(64, 16)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))

def build():
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    return parallelize_module(MLP(), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()}), (torch.randn(4, 16),)
'''


def test_cli_world_size_json(tmp_path) -> None:
    from click.testing import CliRunner

    from fxviz.cli import cli

    f = tmp_path / "tp.py"
    f.write_text(FACTORY)
    out = tmp_path / "g.json"
    r = CliRunner().invoke(cli, ["json", f"{f}:build", "--world-size", "8", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert not dist.is_initialized()
    g = Graph.from_json(out.read_text())
    assert [(c["kind"], c["module"], c["bytes"]) for c in collectives(g)] == [("all_reduce", "down", 256)]
    r = CliRunner().invoke(cli, ["tree", f"{f}:build", "--world-size", "8", "--overlay", "comm"])
    assert r.exit_code == 0, r.output
    assert "comm" in r.output or "256" in r.output


def test_cli_sharded_capture_ends_clean_and_a_factory_without_a_group_is_told_how(tmp_path) -> None:
    """The row-parallel output is an unwaited functional collective: torch warns at exit about it
    unless the capture waits it as the user's code would on reading it. A factory that needs a
    process group but got none is told about --world-size, in one line."""
    f = tmp_path / "tp.py"
    f.write_text(FACTORY)
    run = [sys.executable, "-m", "fxviz", "tree", f"{f}:build"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    r = subprocess.run([*run, "--world-size", "8"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "all_reduce" in r.stdout and "unwaited" not in r.stderr and r.stderr.strip() == ""
    r = subprocess.run(run, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    [line] = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert line.startswith("error: factory") and "pass --world-size N" in line


def test_dtensor_outputs_carry_their_placement() -> None:
    g = fxviz.capture(mlp_factory, world_size=8)
    by_target = {n.target: n for n in g.nodes if n.kind == "op"}
    up = g.node(g.calls.calls("up")[0].ops[-1])  # the colwise layer's output: sharded on its last dim
    assert up.attrs["placements"] == "S(1)" and up.attrs["mesh"] == "8"
    relu = next(n for t, n in by_target.items() if "relu" in t)
    assert "placements" not in relu.attrs and relu.outputs[0].shape == (4, 8)  # the local shard, a plain tensor
    down = g.node(next(o for o in g.calls.calls("down")[0].ops if "linear" in o))
    assert down.attrs["placements"] == "P(sum)"  # partial sums: why the all_reduce follows
    g2 = Graph.from_json(g.to_json())
    assert g2.node(up.name).attrs["placements"] == "S(1)"


def test_sequence_parallel_on_2d_mesh_groups_and_placements() -> None:
    g = fxviz.capture(sp_factory, world_size=8)
    recs = collectives(g)
    assert {r["kind"] for r in recs} == {"all_gather", "reduce_scatter"}
    assert {r["group_size"] for r in recs} == {4}  # the tp dimension of the 2 x 4 mesh
    assert all(r.get("node") for r in recs)  # each linked to the tracer's op node
    assert any(n.attrs.get("mesh") == "tp=4" for n in g.nodes)


def test_llama_70b_shape_on_meta_captures_without_weights() -> None:
    """Two layers of the 70B shape (hidden 8192, MLP 28672, vocab 128256) on meta, TP x8: one
    all_reduce after attention and one after the MLP per layer, each the (1, 128, 8192) float32 partial."""
    bench = _bench()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g = fxviz.capture(lambda: bench.llama70b(2), world_size=8)
    # fake tensors have no storage: the tracer must not ask them for a data pointer (torch warns)
    assert not [str(w.message) for w in caught if "data pointer" in str(w.message)]
    recs = collectives(g)
    assert [(r["kind"], r["module"]) for r in recs] == [
        ("all_reduce", f"layers.{i}.{m}") for i in range(2) for m in ("self_attn.o_proj", "mlp.down_proj")]
    assert {r["bytes"] for r in recs} == {128 * 8192 * 4}
    assert g.node(next(o for o in g.calls.calls("layers.0.mlp.gate_proj")[0].ops if "linear" in o)).attrs["placements"] == "S(2)"
    assert not dist.is_initialized()


def test_saved_graph_reads_and_shows_comm_without_torch(tmp_path) -> None:
    g = fxviz.capture(mlp_factory, world_size=8)
    f = tmp_path / "g.json"
    f.write_text(g.to_json())
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from fxviz.ir import Graph; from fxviz.passes.comm import collectives; from fxviz.passes.overlays import overlays\n"
        f"g = Graph.from_json(open({str(f)!r}).read())\n"
        "print([c['kind'] for c in collectives(g)], sorted(overlays(g)['comm']['nodes'].values()),\n"
        "      [n.attrs['placements'] for n in g.nodes if 'placements' in n.attrs])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)})
    placements = [n.attrs["placements"] for n in g.nodes if "placements" in n.attrs]
    assert "P(sum)" in placements
    assert out.stdout.strip() == f"['all_reduce'] [256] {placements}"


def fsdp_factory():
    """FSDP2 over a 1-D ``dp`` mesh: each block and the root sharded, as in training code."""
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("dp",))
    torch.manual_seed(0)
    m = nn.Sequential(MLP(), MLP())
    for block in m:
        fully_shard(block, mesh=mesh)
    fully_shard(m, mesh=mesh)
    return m, (torch.randn(4, 16),)


def test_fsdp2_all_gather_per_sharded_block_equals_comm_debug_mode() -> None:
    g = fxviz.capture(fsdp_factory, world_size=4)
    assert not dist.is_initialized()
    assert counts(g) == oracle(fsdp_factory, 4)
    recs = collectives(g)
    assert [(r["kind"], r["module"], r["mesh_dim"], r["group_size"]) for r in recs] == [
        ("all_gather", m, "dp", 4) for m in ("0", "1")]
    params = sum(p.numel() for p in MLP().parameters())  # 16*64 + 64 + 64*16 + 16 = 2128 floats
    assert [r["bytes"] for r in recs] == [params // 4 * 4] * 2  # each rank sends its quarter (float32)


@pytest.mark.parametrize("factory", [mlp_factory, block_factory])
def test_values_flow_through_dtensor_boundaries(factory) -> None:
    """DTensor's from_local/to_local are autograd Functions the tracer's mode does not see: the
    DTensor (or local shard) an op reads must still be the output of the op that made it, never a
    `constant` that cuts the graph at every sharded layer."""
    g = fxviz.capture(factory, world_size=4)
    assert [n.name for n in g.nodes if n.kind == "constant"] == []
    ops = {n.name: n for n in g.nodes if n.kind == "op"}
    linears = [n for n in ops.values() if n.target == "torch.nn.functional.linear"]
    assert linears and all(ops.get(n.inputs[0].node) is not None or g.node(n.inputs[0].node).kind == "input"
                           for n in linears)
    if factory is mlp_factory:
        relu = next(n for n in ops.values() if n.target == "torch.relu")
        assert [r.node for r in relu.inputs] == ["linear"]


class Rebinds(nn.Module):
    """A forward that rebinds a DTensor parameter's ``.data`` to another DTensor (another shape and
    placement): the snapshot keeps an alias of each parameter's data to put back."""

    def __init__(self) -> None:
        super().__init__()
        self.mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        self.w = nn.Parameter(distribute_tensor(torch.randn(8, 16), self.mesh, [Shard(0)]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.w.to_local().sum() + x
        self.w.data = DTensor.from_local(torch.zeros(3, 3), self.mesh, [Replicate()])
        return y


def test_a_rebound_dtensor_parameter_is_put_back() -> None:
    made: list[tuple[nn.Module, torch.Tensor, torch.Tensor]] = []

    def factory():
        torch.manual_seed(0)
        m = Rebinds()
        made.append((m, m.w, m.w.to_local().clone()))
        return m, (torch.randn(2),)

    fxviz.capture(factory, world_size=4)
    m, w, local = made[0]
    assert m.w is w and type(w) is DTensor
    assert (tuple(w.shape), w.placements) == ((8, 16), (Shard(0),))
    assert torch.equal(w.to_local(), local)


def test_a_command_that_does_not_join_torchrun_says_so_not_to_launch_torchrun(tmp_path, monkeypatch) -> None:
    """``fxviz compile`` under torchrun (the launcher's variables set) builds the factory outside
    any group; the hint told the user to do what they did, "launch it with torchrun"."""
    from click.testing import CliRunner

    from fxviz.cli import cli

    f = tmp_path / "tp.py"
    f.write_text(FACTORY)
    for k, v in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(k, v)
    r = CliRunner().invoke(cli, ["compile", f"{f}:build"])
    assert r.exit_code != 0 and not dist.is_initialized()
    [line] = [ln for ln in r.output.splitlines() if ln.startswith("error: ")]
    assert "does not join torchrun's" in line and "run it without torchrun, with --world-size N" in line
    assert "launch it with torchrun" not in line
