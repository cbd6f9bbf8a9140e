"""Capturing sharded models under a fake process group (issue 22 points 1, 2, 6)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import fxviz
from fxviz.errors import TargetError
from fxviz.ir import Graph
from fxviz.passes.comm import collectives
from fxviz.passes.overlays import overlays
from fxviz.torchbridge.comms import CommRecorder, _kind


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


def oracle(factory, world_size: int) -> dict[str, dict[str, int]]:
    """CommDebugMode's own per-module counts on the same model and inputs."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        model, args = factory()
        mode = CommDebugMode()
        with mode:
            model(*args)
        return {("" if k == "Global" else k.partition(".")[2]): {_kind(str(op)): n for op, n in v["forward"].items() if n}
                for k, v in mode.comm_module_counts.items()}
    finally:
        dist.destroy_process_group()


def counts(graph: Graph) -> dict[str, dict[str, int]]:
    """Per-module counts from the graph's records, own and inherited by every ancestor (as CommDebugMode)."""
    out: dict[str, dict[str, int]] = {}
    for r in collectives(graph):
        path = r["module"]
        parts = path.split(".") if path else []
        for k in range(len(parts), -1, -1):
            d = out.setdefault(".".join(parts[:k]), {})
            d[r["kind"]] = d.get(r["kind"], 0) + 1
    return out


@pytest.mark.parametrize("factory", [mlp_factory, block_factory])
def test_counts_per_module_equal_comm_debug_mode(factory) -> None:
    assert not dist.is_initialized()
    g = fxviz.capture(factory, world_size=4)
    assert not dist.is_initialized()  # the group fxviz made is gone
    want = oracle(factory, 4)
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
        dist.destroy_process_group()


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


def test_recorder_is_comm_debug_mode() -> None:
    assert issubclass(CommRecorder, CommDebugMode)


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
