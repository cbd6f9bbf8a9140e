"""A real multi-process run (issue 22 point 3): ``torchrun --nproc-per-node 2 -m fxviz json
TARGET`` on gloo (CPU) captures every rank in the launch's own process group, rank 0 gathers the
ranks' graphs, compares their collectives (:func:`fxviz.passes.comm.rank_mismatches`) and is the only
one that writes; the graph is the one the fake process group gives for the same model."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import fxviz
from tests import test_distributed as td

pytestmark = pytest.mark.slow  # two processes start torch

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _torchrun_json(target: str, timeout: int) -> subprocess.CompletedProcess[str]:
    """``torchrun --nproc-per-node 2 -m fxviz json TARGET`` on gloo, collectives timing out after
    ``timeout`` seconds."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "FXVIZ_COLLECTIVE_TIMEOUT": str(timeout)}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           "--master-port", str(_free_port()), "-m", "fxviz", "json", target],
                          capture_output=True, text=True, timeout=300, env=env, cwd=REPO)


def test_torchrun_gives_rank_0s_graph_with_the_ranks_compared() -> None:
    proc = _torchrun_json(f"{REPO / 'tests' / 'test_distributed.py'}:mlp_factory", timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = json.loads(proc.stdout)  # one JSON document: rank 1 wrote nothing
    a = d["annotations"]
    assert a["rank"] == 0 and a["rank_mismatches"] == []
    assert any("rank 0 of 2 (torchrun): every rank issued the same 1 collective" in n for n in d["notes"])
    # the same collectives as the fake process group records for the model (kind, bytes, module)
    fake = fxviz.capture(td.mlp_factory, world_size=2)
    key = [(c["kind"], c["bytes"], c.get("module")) for c in fake.annotations["collectives"]]
    assert [(c["kind"], c["bytes"], c.get("module")) for c in a["collectives"]] == key
    assert [n["target"] for n in d["nodes"] if n["kind"] == "op"] == [n.target for n in fake.ops]


class Raises(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x)
        raise ValueError("the model's own error")


def raises_factory() -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    return Raises(), (torch.ones(4),)


def test_torchrun_a_model_that_raises_is_one_partial_graph_and_a_line_per_rank() -> None:
    """Every rank raises: rank 0 writes its partial graph (one JSON document on stdout, not one per
    rank) and its line; the other ranks say only theirs, with their rank."""
    proc = _torchrun_json(f"{Path(__file__)}:raises_factory", timeout=120)
    assert proc.returncode != 0
    d = json.loads(proc.stdout)  # exactly one document
    assert [n["name"] for n in d["nodes"] if n["kind"] == "op"] == ["all_reduce"]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert sorted(e.startswith("error: rank 1 of 2: the model raised") for e in errors) == [False, True]
    assert all("the model's own error" in e for e in errors)


class OnlyRank0Reduces(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x)
        if dist.get_rank() == 0:
            dist.all_reduce(x)  # rank 1 never issues it: rank 0 waits until the group's timeout
        return x * 2


def only_rank0_factory() -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    return OnlyRank0Reduces(), (torch.ones(4),)


def test_torchrun_the_rank_that_did_not_hang_says_so_not_that_fxviz_has_a_bug() -> None:
    """Rank 1 finishes its capture and sends its graph to rank 0, which waits in the all-reduce
    rank 1 never issued; when gloo's timeout ends that wait, rank 1's send fails. Rank 1 printed
    gloo's transport error as "a bug in fxviz" (exit 70); it says what happened, with its rank,
    and rank 0 says which collective hung."""
    proc = _torchrun_json(f"{Path(__file__)}:only_rank0_factory", timeout=5)
    assert proc.returncode != 0
    errors = sorted(line for line in proc.stderr.splitlines() if line.startswith("error: "))
    assert "bug in fxviz" not in proc.stderr
    assert len(errors) == 2, proc.stderr[-3000:]
    assert errors[0].startswith("error: a collective never returned: all_reduce")
    assert errors[1].startswith("error: rank 1 of 2: captured, but its graph never reached rank 0")
