"""A collective that never returns (issue 22, "Must hold": a clear line, the partial graph kept).

torch's fake backend never hangs, so the scenario is a real one: a gloo group of two ranks, this
process rank 0, the peer another process that joins the group, takes part in the first all-reduce
and then issues nothing more (a rank that stopped, or went another way: the classic hang). The
group's timeout is one second; rank 0's second all-reduce waits for it to run out, and torch
reports the timeout (gloo: ``RuntimeError: [...] Timed out waiting 1000ms for recv operation``).
"""

from __future__ import annotations

import datetime
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch import nn

import fxviz
from fxviz.errors import CollectiveTimeout, ModelError
from fxviz.passes.comm import collectives
from fxviz.torchbridge.distributed import end_world

PEER = """
import datetime, sys, time, torch, torch.distributed as dist
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), 2, True, timeout=datetime.timedelta(seconds=60),
                      wait_for_workers=False)
print("ready", flush=True)
dist.init_process_group("gloo", store=store, rank=1, world_size=2, timeout=datetime.timedelta(seconds=60))
dist.all_reduce(torch.ones(4, 8))  # the first collective, as rank 0's
time.sleep(60)  # and then nothing: rank 0's second all-reduce never completes
"""


@pytest.fixture
def stalled_peer() -> Iterator[None]:
    """A real gloo group of 2 (1 s timeout) whose peer takes part in one all-reduce only."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    peer = subprocess.Popen([sys.executable, "-c", PEER, str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert peer.stdout is not None and peer.stdout.readline().strip() == "ready"
        store = dist.TCPStore("127.0.0.1", port, 2, False, timeout=datetime.timedelta(seconds=30))
        dist.init_process_group("gloo", store=store, rank=0, world_size=2, timeout=datetime.timedelta(seconds=1))
        yield
    finally:
        if dist.is_initialized():
            end_world()
        peer.kill()
        peer.wait()


class TwoReduces(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        dist.all_reduce(y)  # the peer takes part
        z = torch.relu(self.b(y))
        dist.all_reduce(z)  # the peer never does: waits for the group's timeout
        return z * 2


def test_collective_that_never_returns_is_one_line_with_the_partial_graph(stalled_peer: None) -> None:
    torch.manual_seed(0)
    with pytest.raises(CollectiveTimeout) as info:
        fxviz.capture(TwoReduces(), (torch.randn(4, 8),), world_size=2)
    e = info.value
    assert isinstance(e, ModelError) and e.exit_code == 1
    msg = str(e)
    assert "\n" not in msg and msg.startswith("a collective never returned: all_reduce on group ")
    assert "(2 ranks)" in msg and "Timed out waiting 1000ms" in msg  # torch's own words for the timeout
    assert f"{__file__}:{TwoReduces.forward.__code__.co_firstlineno + 4}" in msg  # the line that hung
    assert e.graph is not None
    recs = collectives(e.graph)
    assert [(r["kind"], r["bytes"], r.get("timed_out", False)) for r in recs] == [
        ("all_reduce", 128, False), ("all_reduce", 128, True)]  # what was recorded up to it, the hung one marked
    assert "Timed out waiting" in recs[1]["error"] and "error" not in recs[0]
    ops = [n.target for n in e.graph.nodes if n.kind == "op"]
    reduce = "torch.distributed.distributed_c10d.all_reduce"  # the model's own calls: nodes of their own
    assert ops == ["torch.nn.functional.linear", reduce, "torch.nn.functional.linear", "torch.relu", reduce]
    hung = e.graph.nodes[-1] if e.graph.nodes[-1].kind == "op" else None
    assert hung is not None and recs[1]["node"] == hung.name and "Timed out waiting" in (hung.error or "")
    assert e.graph.node(recs[0]["node"]).error is None
    assert "Tensor.mul" not in ops and "torch.mul" not in ops  # nothing after the hang
    assert dist.is_initialized()  # the caller's group is left to the caller


@torch.library.custom_op("fxviz_test::fails_after_a_collective", mutates_args=())
def _fails(x: torch.Tensor) -> torch.Tensor:
    raise ValueError("the model's own error")


class FailsAfter(nn.Module):
    """A collective that completes, then an op of the model's that raises (a custom op: the
    collectives' recorder sees its dispatch, unlike torch's own ops on plain tensors)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        dist.all_reduce(y)
        return _fails(y)


def test_a_models_own_error_after_a_collective_is_not_the_collectives() -> None:
    with pytest.raises(ModelError) as info:
        fxviz.capture(lambda: (FailsAfter(), (torch.randn(2, 8),)), world_size=4)
    assert "the model's own error" in str(info.value) and not isinstance(info.value, CollectiveTimeout)
    graph = info.value.graph
    assert graph is not None
    (r,) = collectives(graph)
    assert r["kind"] == "all_reduce" and "error" not in r  # it completed: the op after it failed
    assert graph.node(r["node"]).error is None
    assert "the model's own error" in (graph.nodes[-1].error or "")
