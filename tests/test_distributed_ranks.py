"""Collectives that differ between ranks (issue 22 point 3): one graph per rank, the first
collective where a rank parts from the others flagged on the graph shown (rank 0's)."""

from __future__ import annotations

from collections import Counter

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor.debug import CommDebugMode

import fxviz
from fxviz.fallback.comms import _kind
from fxviz.ir import Graph
from fxviz.passes.comm import collectives, rank_mismatches
from fxviz.torchbridge.distributed import end_world
from tests.test_distributed import mlp_factory, sp_factory, waited


class RankBranch(nn.Module):
    """Rank 0 alone all-reduces a metric before the all-gather every rank issues: a hang."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.distributed import _functional_collectives as funcol

        y = self.lin(x)
        dist.all_reduce(y)
        if dist.get_rank() == 0:
            dist.all_reduce(y.sum())
        return funcol.all_gather_tensor(y, 0, dist.group.WORLD)


def on_rank(rank: int, world_size: int, factory) -> tuple[Graph, Counter[str]]:
    """The graph of ``rank`` (a fake group the test makes, which capture uses as it is) and
    ``CommDebugMode``'s count per kind on the same rank."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        torch.manual_seed(0)
        g = fxviz.capture(factory, world_size=world_size)
        model, args = factory()
        with CommDebugMode() as mode:
            waited(model(*args))
        return g, Counter({_kind(str(op)): n for op, n in mode.get_comm_counts().items() if n})
    finally:
        end_world()


def branch_factory():
    return RankBranch(), (torch.randn(4, 8),)


def test_collective_only_one_rank_issues_is_flagged_on_rank_0() -> None:
    (g0, want0), (g1, want1) = on_rank(0, 2, branch_factory), on_rank(1, 2, branch_factory)
    assert g0.annotations["rank"] == 0 and g1.annotations["rank"] == 1
    assert Counter(r["kind"] for r in collectives(g0)) == want0 == {"all_reduce": 2, "all_gather": 1}
    assert Counter(r["kind"] for r in collectives(g1)) == want1 == {"all_reduce": 1, "all_gather": 1}
    flags = rank_mismatches([g0, g1])
    assert flags == [{"group": "0", "index": 1, "ranks": {
        "0": "all_reduce (4 B, forward, the model)", "1": "all_gather (128 B, forward, the model)"}}]
    recs = collectives(g0)
    assert "rank_mismatch" not in recs[0] and recs[1]["rank_mismatch"].startswith("collective 2 on 0 differs")
    assert any(n.startswith("collective 2 on 0 differs between ranks: rank 0 all_reduce") and "hang" in n
               for n in g0.notes)
    assert g0.annotations["rank_mismatches"] == flags
    # saved graphs compare the same, without a process group
    assert rank_mismatches([Graph.from_json(g0.to_json()), Graph.from_json(g1.to_json())]) == flags


def test_ranks_that_agree_are_not_flagged() -> None:
    """The same tensor-parallel MLP on two ranks, and the 2-D (dp, tp) decoder on two ranks of
    one tp group and on a rank of the other (4; it failed in torch itself after rank 0, on a stale
    group name in DTensor's caches, until each group's end cleared them): nothing to flag."""
    g0, _ = on_rank(0, 4, mlp_factory)
    g1, _ = on_rank(1, 4, mlp_factory)
    assert rank_mismatches([g0, g1]) == [] and len(collectives(g0)) == 1
    s0, _ = on_rank(0, 8, sp_factory)
    s1, _ = on_rank(1, 8, sp_factory)
    s4, want4 = on_rank(4, 8, sp_factory)
    assert {r["mesh_dim"] for r in collectives(s1)} == {"tp"}
    assert Counter(r["kind"] for r in collectives(s4)) == want4 == {"all_gather": 4, "reduce_scatter": 5}
    assert rank_mismatches([s0, s1, s4]) == [] and len(collectives(s0)) == 9
    assert s0.annotations["rank_mismatches"] == [] and not any("differs between ranks" in n for n in s0.notes)
