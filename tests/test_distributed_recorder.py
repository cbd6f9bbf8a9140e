"""The collectives' recorder of a sharded capture: every collective of the forward is recorded,
including those no torch-function mode sees, and the recorder (a dispatch mode, which every op
pays for) is on for the model's run only, not for the rest of the capture (issue 22, benchmark)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

import fxviz
import fxviz.fallback.comms as comms
import fxviz.torchbridge.guard as guard
from fxviz.passes.comm import collectives
from tests.test_distributed import counts, fsdp_factory, mlp_factory, oracle, sp_factory


class Implicit(nn.Module):
    """A softmax over the dimension its DTensor weight is sharded on: DTensor gathers the weight
    inside the softmax's own dispatch, below any torch-function call (no hook, no user line of its own)."""

    def __init__(self) -> None:
        super().__init__()
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        self.w = nn.Parameter(distribute_tensor(torch.randn(8, 16), mesh, [Shard(1)]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.w, dim=1).to_local() + x


def implicit_factory() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return Implicit(), (torch.randn(8, 16),)


def test_collective_inside_a_dtensor_op_is_recorded() -> None:
    """The all-gather DTensor runs inside ``torch.softmax``'s dispatch is seen by no torch-function
    mode (the tracer has no op node for it): a recorder at that level alone would drop it."""
    g = fxviz.capture(implicit_factory, world_size=4)
    want = oracle(implicit_factory, 4)
    assert want[""] == {"all_gather": 1}  # torch's own record: one collective, inside the softmax
    assert counts(g) == want
    (r,) = collectives(g)
    assert (r["kind"], r["group_size"], r["bytes"]) == ("all_gather", 4, 8 * 16 // 4 * 4)
    assert "node" not in r  # no op node of its own: the tracer's function mode never saw it
    assert not [n for n in g.nodes if n.kind == "op" and "c10d" in n.target]


@pytest.mark.parametrize(("factory", "world_size"), [(mlp_factory, 8), (sp_factory, 8), (fsdp_factory, 4),
                                                     (implicit_factory, 4)])
def test_a_dropped_collective_is_caught(factory: Any, world_size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-module comparison with ``CommDebugMode`` (tensor parallel, sequence parallel,
    FSDP2, implicit redistribution) fails when the recorder loses one collective."""
    record = comms.CommRecorder._record

    def drop_first(self: comms.CommRecorder, *a: Any) -> None:
        record(self, *a)
        if getattr(self, "_dropped", False) is False:
            self._dropped = True  # type: ignore[attr-defined]
            self.records.pop()

    want = oracle(factory, world_size)
    assert counts(fxviz.capture(factory, world_size=world_size)) == want
    monkeypatch.setattr(comms.CommRecorder, "_record", drop_first)
    assert counts(fxviz.capture(factory, world_size=world_size)) != want


def test_recorder_is_on_for_the_forward_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model's snapshot (each DTensor parameter's ``.data`` is a DTensor op) runs without
    the recorder's dispatch mode, which would see each of its ops; the forward runs under it."""
    modes_at_snapshot: list[int] = []
    init = guard.ModelState.__init__

    def spy(self: guard.ModelState, *a: Any, **k: Any) -> None:
        modes_at_snapshot.append(torch._C._len_torch_dispatch_stack())
        init(self, *a, **k)

    monkeypatch.setattr(guard.ModelState, "__init__", spy)
    g = fxviz.capture(mlp_factory, world_size=4)
    assert modes_at_snapshot and set(modes_at_snapshot) == {0}
    assert [r["kind"] for r in collectives(g)] == ["all_reduce"]

