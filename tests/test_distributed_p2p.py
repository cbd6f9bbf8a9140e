"""Point-to-point communication under the fake process group (issue 22 point 2: send/recv).

``CommDebugMode`` counts no point-to-point op, so torch's own record here is the dispatcher's: a
dispatch mode entered around the capture sees each ``c10d`` op the run issues, with its arguments
(tensors, group, peer's rank in the group).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.debug import CommDebugMode
from torch.utils._python_dispatch import TorchDispatchMode

import fxviz
from fxviz.errors import ModelError
from fxviz.ir import Graph
from fxviz.passes.comm import collectives, rank_mismatches


class C10dLog(TorchDispatchMode):
    """torch's record: each ``c10d`` op dispatched, its name, the peer it names and its tensors' bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, int, int]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func.namespace == "c10d":
            tensors = args[0]
            peer = int(args[2]) if func.__name__.split(".")[0] in ("send", "recv_") else -1
            self.ops.append((str(func._overloadpacket), peer, sum(t.numel() * t.element_size() for t in tensors)))
        return func(*args, **(kwargs or {}))


class P2P(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.out = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        dist.send(y, dst=1)
        buf = torch.empty(2, 4)
        dist.recv(buf, src=3)
        dist.isend(self.out(y), dst=2).wait()
        for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, y, 1), dist.P2POp(dist.irecv, buf, 3)]):
            w.wait()
        return y.sum() + buf


def p2p_factory() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return P2P(), (torch.randn(2, 8),)


def test_send_and_recv_recorded_with_peer_and_bytes_as_the_dispatcher_saw_them() -> None:
    log = C10dLog()
    with log:
        g = fxviz.capture(p2p_factory, world_size=4)
    assert not dist.is_initialized()
    recs = collectives(g)
    assert [(r["op"], r["peer"], r["bytes"]) for r in recs] == log.ops
    assert [(r["kind"], r["peer"], r["bytes"], r["group_size"]) for r in recs] == [
        ("send", 1, 64, 4), ("recv", 3, 32, 4), ("send", 2, 32, 4), ("send", 1, 64, 4), ("recv", 3, 32, 4)]
    lines = [r["source"].rpartition(":")[2] for r in recs]
    first = P2P.forward.__code__.co_firstlineno
    assert lines[:3] == [str(first + 2), str(first + 4), str(first + 5)]
    assert any(n.startswith("collectives on group") and "5," in n for n in g.notes)


def test_comm_debug_mode_counts_no_point_to_point_op() -> None:
    """Why the dispatcher is the oracle: torch's own table leaves sends and recvs out."""
    with fxviz.torchbridge.distributed.fake_world(4):
        model, args = p2p_factory()
        mode = CommDebugMode()
        with mode:
            model(*args)
    assert mode.get_total_counts() == 0


class SubgroupSend(nn.Module):
    """A send on one dimension of a 2 x 2 mesh: the op names its peer by rank in that group."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.group = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "tp")).get_group("pp")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        dist.send(y, group_dst=1, group=self.group)
        return y


def test_peer_is_the_global_rank() -> None:
    log = C10dLog()
    with log:
        g = fxviz.capture(lambda: (SubgroupSend(), (torch.randn(3, 4),)), world_size=4)
    (rec,) = collectives(g)
    assert log.ops == [("c10d.send", 1, 48)]  # the op: rank 1 of the group
    assert (rec["kind"], rec["peer"], rec["bytes"], rec["group_size"]) == ("send", 2, 48, 2)


def test_a_send_and_its_recv_are_no_rank_mismatch() -> None:
    """Rank 0 sends what rank 1 receives: their sequences differ by design, not a hang."""
    def graph(rank: int, kind: str) -> Graph:
        g = Graph(name="m", nodes=[], method="eager")
        g.annotations["rank"] = rank
        g.annotations["collectives"] = [
            {"kind": kind, "op": f"c10d.{kind}", "group": "0", "group_size": 2, "bytes": 64, "module": "",
             "peer": 1 - rank, "mesh_dim": ""},
            {"kind": "all_reduce", "op": "c10d.allreduce_", "group": "0", "group_size": 2, "bytes": 8 * (rank + 1),
             "module": "", "mesh_dim": ""}]
        return g
    flags = rank_mismatches([graph(0, "send"), graph(1, "recv")])
    assert [f["index"] for f in flags] == [0]  # the all-reduce, first of the group's collectives
    assert "all_reduce" in flags[0]["ranks"]["0"]



def _p2p_graph(rank: int, *records: tuple[str, int, int]) -> Graph:
    """Rank ``rank``'s graph with its (kind, peer, bytes) sends and recvs."""
    g = Graph(name="m", nodes=[], method="eager")
    g.annotations["rank"] = rank
    g.annotations["collectives"] = [{"kind": k, "op": f"c10d.{k}", "group": "0", "group_size": 2, "bytes": b,
                                     "module": "", "peer": peer, "mesh_dim": ""} for k, peer, b in records]
    return g


def test_a_send_whose_receive_differs_is_flagged() -> None:
    """Each rank's sends to a peer must be that peer's receives from it, in order and size: rank 1
    receiving 128 bytes where rank 0 sends 64 (gloo runs it: the rest of its buffer is not what was
    sent), or a receive no send answers (a hang). Sends and recvs were left out of the comparison
    altogether, and the note said every rank issued "the same 1 collective"."""
    ok = [_p2p_graph(0, ("send", 1, 64), ("recv", 1, 8)), _p2p_graph(1, ("recv", 0, 64), ("send", 0, 8))]
    assert rank_mismatches(ok) == []
    sized = [_p2p_graph(0, ("send", 1, 64)), _p2p_graph(1, ("recv", 0, 128))]
    [flag] = rank_mismatches(sized)
    assert (flag["group"], flag["index"]) == ("send 0->1", 0)
    assert flag["ranks"] == {"0": "send (64 B, forward, the model)", "1": "recv (128 B, forward, the model)"}
    assert collectives(sized[0])[0]["rank_mismatch"].startswith("send 1 from rank 0 to rank 1 does not match")
    assert any("not the size of what is sent" in n for n in sized[0].notes)
    unanswered = [_p2p_graph(0, ("send", 1, 64), ("recv", 1, 8)), _p2p_graph(1, ("recv", 0, 64))]
    [flag] = rank_mismatches(unanswered)
    assert (flag["group"], flag["ranks"]) == ("send 1->0", {"1": "nothing", "0": "recv (8 B, forward, the model)"})
    assert any("waits for a message never sent (a hang)" in n for n in unanswered[0].notes)
    # a receive from any source may take any send: what goes to its rank is not paired
    assert rank_mismatches([_p2p_graph(0, ("send", 1, 64)), _p2p_graph(1, ("recv", -1, 64))]) == []

class FirstStage(nn.Module):
    """Stage 0 of a two-stage pipeline, run by its schedule (GPipe, two microbatches)."""

    def __init__(self) -> None:
        super().__init__()
        from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

        self.part = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
        self.schedule = ScheduleGPipe(PipelineStage(self.part, 0, 2, torch.device("cpu")), n_microbatches=2)

    def forward(self, x: torch.Tensor) -> Any:
        return self.schedule.step(x)


def test_pipeline_stage_sends_its_microbatches() -> None:
    log = C10dLog()
    with log:
        g = fxviz.capture(lambda: (FirstStage(), (torch.randn(4, 8),)), world_size=2)
    recs = collectives(g)
    assert [(r["op"], r["peer"], r["bytes"]) for r in recs] == log.ops
    # after the stages' shape handshake, each microbatch's activation (2 x 8 float32) goes to stage 1
    assert [(r["kind"], r["peer"], r["bytes"]) for r in recs[-2:]] == [("send", 1, 64)] * 2
    assert sum(n.module == "part.0" for n in g.nodes if n.kind == "op") == 3  # shape inference, two microbatches


class AnySource(nn.Module):
    """Receives from whichever rank sends: ``irecv`` without ``src`` (runs), then ``recv`` without
    ``src``, which asks the fake work for the sender's rank it does not have."""

    def __init__(self, blocking: bool) -> None:
        super().__init__()
        self.blocking = blocking

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        buf = torch.empty(3)
        dist.irecv(buf).wait()
        if self.blocking:
            dist.recv(buf)
        return x + buf


def test_receive_from_any_source() -> None:
    log = C10dLog()
    with log:
        g = fxviz.capture(lambda: (AnySource(False), (torch.randn(3),)), world_size=2)
    assert [(r["op"], r["peer"], r["bytes"]) for r in collectives(g)] == log.ops == [("c10d.recv_any_source_", -1, 12)]
    with pytest.raises(ModelError) as e:
        fxviz.capture(lambda: (AnySource(True), (torch.randn(3),)), world_size=2)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("a receive from any source") and "pass src=" in msg
    assert not dist.is_initialized()
    assert e.value.graph is not None
    recs = collectives(e.value.graph)
    assert [(r["kind"], r["peer"]) for r in recs] == [("recv", -1)] * 2
    assert "sourceRank" in recs[-1]["error"] and "error" not in recs[0]  # torch's words, on the one that failed
