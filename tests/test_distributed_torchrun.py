"""A real multi-process run (issue 22 point 3): ``torchrun --nproc-per-node 2 -m fxviz json
TARGET`` on gloo (CPU) captures every rank in the launch's own process group, rank 0 gathers the
ranks' graphs, compares their collectives (:func:`fxviz.passes.comm.rank_mismatches`) and is the only
one that writes; the graph is the one the fake process group gives for the same model."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

import fxviz
from fxviz.passes.tree import tree_of
from tests import test_distributed as td
from tests.test_distributed_p2p import C10dLog

pytestmark = pytest.mark.slow  # two processes start torch

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _torchrun_json(target: str, timeout: int, **env_vars: str) -> subprocess.CompletedProcess[str]:
    """``torchrun --nproc-per-node 2 -m fxviz json TARGET`` on gloo, collectives timing out after
    ``timeout`` seconds."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "FXVIZ_COLLECTIVE_TIMEOUT": str(timeout), **env_vars}
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
    # torchrun's own summary of the failed ranks (its ChildFailedError, which it always raises)
    # gives each rank's line, from the error file its agent named, not "To enable traceback see"
    summary = proc.stderr[proc.stderr.index("Root Cause (first observed failure):"):]
    root = [line.partition("traceback : ")[2] for line in summary.splitlines() if "traceback : " in line]
    assert len(root) == 1 and root[0] in errors
    shown = [line.partition("traceback : ")[2] for line in proc.stderr.splitlines() if "traceback : " in line]
    assert sorted(shown) == sorted(errors) and "To enable traceback" not in proc.stderr


class OnlyRank0Reduces(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x)
        if dist.get_rank() == 0:
            dist.all_reduce(x)  # rank 1 never issues it: rank 0 waits until the group's timeout
        return x * 2


def only_rank0_factory() -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    return OnlyRank0Reduces(), (torch.ones(4),)


def test_torchrun_the_rank_that_did_not_hang_says_so_not_that_fxviz_has_a_bug() -> None:
    """Rank 1 finishes its capture while rank 0 waits in the all-reduce rank 1 never issued. Rank 1
    printed gloo's transport error as "a bug in fxviz" (exit 70); its graph now reaches rank 0
    through the launch's store, not a collective, so it leaves quietly, and rank 0 says which
    collective hung and shows, in its partial graph, that rank 1 never issued it."""
    proc = _torchrun_json(f"{Path(__file__)}:only_rank0_factory", timeout=5)
    assert proc.returncode != 0
    errors = sorted(line for line in proc.stderr.splitlines() if line.startswith("error: "))
    assert "bug in fxviz" not in proc.stderr
    assert len(errors) == 1, proc.stderr[-3000:]
    assert errors[0].startswith("error: a collective never returned: all_reduce")
    d = json.loads(proc.stdout)
    [flag] = d["annotations"]["rank_mismatches"]
    assert (flag["index"], flag["ranks"]["1"]) == (1, "nothing") and flag["ranks"]["0"].startswith("all_reduce (16 B")
    assert d["annotations"]["collectives"][1]["rank_mismatch"].startswith("collective 2 on 0 differs between ranks")

class Stage(nn.Module):
    """One of two pipeline stages (``torch.distributed.pipelining``, GPipe, two microbatches) per
    rank. torch's record of the run: the ``c10d`` ops the dispatcher saw on each rank, written to
    ``$FXVIZ_TEST_C10D.<rank>`` (CommDebugMode counts no point-to-point op)."""

    def __init__(self) -> None:
        super().__init__()
        from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

        self.rank = dist.get_rank()
        self.part = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
        self.schedule = ScheduleGPipe(PipelineStage(self.part, self.rank, 2, torch.device("cpu")), n_microbatches=2)

    def forward(self, x: torch.Tensor) -> Any:
        with C10dLog() as log:
            out = self.schedule.step(x) if self.rank == 0 else self.schedule.step()
        Path(f"{os.environ['FXVIZ_TEST_C10D']}.{self.rank}").write_text(json.dumps(log.ops))
        return out


def stage_factory() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return Stage(), (torch.randn(4, 8),)


def test_torchrun_pipeline_stages_send_what_the_next_rank_receives(tmp_path: Path) -> None:
    """Rank 0 runs stage 0, rank 1 stage 1: rank 0's sends and receives are the dispatcher's (kind,
    peer, bytes), each send is rank 1's receive of the same size, and no rank is flagged."""
    proc = _torchrun_json(f"{Path(__file__)}:stage_factory", timeout=120, FXVIZ_TEST_C10D=str(tmp_path / "c10d"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = json.loads(proc.stdout)
    recs = d["annotations"]["collectives"]
    torch0, torch1 = (json.loads((tmp_path / f"c10d.{r}").read_text()) for r in (0, 1))
    assert [[r["op"], r["peer"], r["bytes"]] for r in recs] == torch0
    assert {r["kind"] for r in recs} == {"send", "recv"} and all(r["peer"] == 1 for r in recs)
    # each microbatch's activation (2 x 8 float32) goes to stage 1, which receives as much from rank 0
    assert [r["bytes"] for r in recs if r["kind"] == "send"][-2:] == [64, 64]
    sends = [b for op, _, b in torch0 if op == "c10d.send"]
    assert [b for op, peer, b in torch1 if op == "c10d.recv_" and peer == 0] == sends
    assert d["annotations"]["rank_mismatches"] == []
    assert any(f"each of the ranks' {len(sends) + sum(op == 'c10d.send' for op, _, _ in torch1)} sends met its "
               "receive, in order and size" in n for n in d["notes"])


class Rank1ReducesTwice(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x)
        if dist.get_rank() == 1:
            dist.all_reduce(x)  # rank 0 never issues it: rank 1 waits until the group's timeout
        return x * 2


def rank1_twice_factory() -> tuple[nn.Module, tuple[torch.Tensor]]:
    return Rank1ReducesTwice(), (torch.ones(4),)


def test_torchrun_rank_0_shows_the_collective_another_rank_hung_in() -> None:
    """Rank 0 finishes; rank 1 hangs in a second all-reduce rank 0 never issues. Rank 0 wrote
    nothing (it waited for rank 1's graph in a gather rank 1 never joined); it writes its whole
    graph, flagged where rank 1's partial one parts from it."""
    proc = _torchrun_json(f"{Path(__file__)}:rank1_twice_factory", timeout=5)
    assert proc.returncode != 0
    d = json.loads(proc.stdout)
    assert [c["kind"] for c in d["annotations"]["collectives"]] == ["all_reduce"]
    [flag] = d["annotations"]["rank_mismatches"]
    assert (flag["index"], flag["ranks"]["0"]) == (1, "nothing") and flag["ranks"]["1"].startswith("all_reduce (16 B")
    assert any(n.startswith("collective 2 on 0 differs between ranks: rank 0 nothing, rank 1 all_reduce")
               for n in d["notes"])
    [line] = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert line.startswith("error: rank 1 of 2: a collective never returned: all_reduce")


def test_torchrun_with_world_size_is_refused_not_written_once_per_rank() -> None:
    """``--world-size`` under torchrun ran a fake group in each rank, and each rank wrote its graph:
    two JSON documents on stdout. It is one line per rank, and nothing written."""
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                           str(_free_port()), "-m", "fxviz", "json", f"{REPO / 'tests' / 'test_distributed.py'}:mlp_factory",
                           "--world-size", "4"], capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode != 0 and proc.stdout == ""
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert errors and all("--world-size 4 runs the factory in a fake process group" in e and "drop --world-size" in e
                          for e in errors)


class UnevenAllToAll(nn.Module):
    """A MoE's dispatch: each rank sends its own number of tokens to each rank (split sizes)."""

    def __init__(self) -> None:
        super().__init__()
        self.expert = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        splits = [2, 4] if dist.get_rank() == 0 else [4, 6]  # rank 0 sends 6 rows, rank 1 sends 10
        got = torch.empty(sum(splits), 16)  # rank 0 gets 2 from itself, 4 from rank 1; rank 1 gets 4 and 6
        dist.all_to_all_single(got, x[: sum(splits)], splits, splits)
        return self.expert(got)


def uneven_factory() -> tuple[nn.Module, tuple[torch.Tensor]]:
    return UnevenAllToAll(), (torch.randn(10, 16),)


def test_torchrun_an_all_to_all_of_each_ranks_own_size_is_no_mismatch() -> None:
    """gloo runs it to the end (no hang: torch's own verdict); rank 0 flagged it as "a hang"
    because the ranks' sizes differ, which they do by design in an all-to-all with split sizes."""
    proc = _torchrun_json(f"{Path(__file__)}:uneven_factory", timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = json.loads(proc.stdout)
    assert [(c["kind"], c["bytes"]) for c in d["annotations"]["collectives"]] == [("all_to_all", 6 * 16 * 4)]
    assert d["annotations"]["rank_mismatches"] == []
    assert any("(an all-to-all's size is each rank's own)" in n for n in d["notes"])


def _write_torch_records(rank: int, log: C10dLog, prof: Any) -> None:
    """Under ``$FXVIZ_TEST_C10D``: the dispatcher's c10d ops of this rank's step, and the autograd
    nodes its backward ran, in order (torch's profiler's record)."""
    if "FXVIZ_TEST_C10D" not in os.environ:
        return
    Path(f"{os.environ['FXVIZ_TEST_C10D']}.{rank}").write_text(json.dumps(log.ops))
    ran = sorted((e for e in prof.events() if e.name.startswith("autograd::engine::evaluate_function: ")),
                 key=lambda e: e.time_range.start)
    Path(f"{os.environ['FXVIZ_TEST_C10D']}.autograd.{rank}").write_text(json.dumps(
        [e.name.split(": ", 1)[1].removeprefix("torch::autograd::") for e in ran]))


class StaticStage(nn.Module):
    """:class:`Stage` given its shapes (``input_args``, ``output_args``): a real run's warm-up vote
    says so and skips the shape inference; with ``loss`` (shapes inferred) the schedule's backward
    runs too, its step inside ``torch.enable_grad()`` (fxviz records a forward under ``no_grad``)."""

    def __init__(self, loss: bool, static: bool | None = None, grad: bool = False) -> None:
        super().__init__()
        from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

        self.rank, self.loss = dist.get_rank(), loss
        self.part = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
        # the example tensors with requires_grad where a gradient flows (grad: the workaround for torch's
        # static metadata, which reads requires_grad from them)
        shapes = {"input_args": torch.empty(2, 8, requires_grad=grad and self.rank > 0),
                  "output_args": torch.empty(2, 8, requires_grad=grad)} if (not loss if static is None else static) else {}
        stage = PipelineStage(self.part, self.rank, 2, torch.device("cpu"), **shapes)
        self.schedule = ScheduleGPipe(stage, n_microbatches=2,
                                      loss_fn=(lambda o, t: (o - t).pow(2).mean()) if loss else None)

    def forward(self, x: torch.Tensor) -> Any:
        kw = {"target": torch.zeros(4, 8)} if self.loss and self.rank == 1 else {}
        with (C10dLog() as log, torch.enable_grad() if self.loss else contextlib.nullcontext(),
              torch.profiler.profile() as prof):
            out = self.schedule.step(x, **kw) if self.rank == 0 else self.schedule.step(**kw)
        _write_torch_records(self.rank, log, prof)
        return out


def static_stage_factory() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return StaticStage(loss=False), (torch.randn(4, 8),)


def loss_stage_factory() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return StaticStage(loss=True), (torch.randn(4, 8),)


def static_loss_stage_factory() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return StaticStage(loss=True, static=True), (torch.randn(4, 8),)


def static_loss_grad_stage_factory() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return StaticStage(loss=True, static=True, grad=True), (torch.randn(4, 8),)


def test_torchrun_a_stage_given_its_shapes_with_a_loss_is_torchs_failure_said_with_its_workaround(
        tmp_path: Path) -> None:
    """A stage given its shapes (``input_args``/``output_args`` as ``torch.empty``) with a loss_fn:
    plain torch's own run, no fxviz (``tests/torch_pipeline_static.py``), fails on rank 0 with "Output
    gradient: ('None',)" (its static metadata takes ``requires_grad`` from the example tensors, so
    stage 0's output expects no gradient), and rank 1 completes. fxviz said torch's multi-line
    words; now one line naming torch's cause and the workaround, which runs: the example tensors made
    with ``requires_grad=True``, rank 0 receives each microbatch's gradient (the dispatcher's
    ``recv_`` of 64 bytes, twice) as in torch's run of the same workaround."""
    plain = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                            str(_free_port()), str(REPO / "tests" / "torch_pipeline_static.py"), str(tmp_path / "t")],
                           capture_output=True, text=True, timeout=300, cwd=REPO)
    torch0, torch1 = (json.loads((tmp_path / f"t.{r}").read_text()) for r in (0, 1))
    assert torch1["without"] == "ok" and torch1["with"] == "ok", plain.stderr[-2000:]
    assert torch0["without"].startswith("RuntimeError: ") and "Output gradient: ('None',)" in torch0["without"]
    assert torch0["with"] == "ok"
    proc = _torchrun_json(f"{Path(__file__)}:static_loss_stage_factory", timeout=60)
    assert proc.returncode != 0
    said = ("error: a pipeline stage given its shapes (PipelineStage input_args/output_args) with a loss_fn fails in "
            "torch's own backward, fxviz or not: torch's static metadata takes requires_grad from those example "
            "tensors, made without it, so stage 0's output expects no gradient (torch: \"Output gradient: None\"); "
            "make them with requires_grad=True (output_args of every stage but the last, input_args of every stage "
            "but the first), or give no shapes and let the stage infer them")
    assert said in proc.stderr.splitlines(), proc.stderr[-3000:]
    proc = _torchrun_json(f"{Path(__file__)}:static_loss_grad_stage_factory", timeout=120,
                          FXVIZ_TEST_C10D=str(tmp_path / "c10d"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = json.loads(proc.stdout)
    log0 = json.loads((tmp_path / "c10d.0").read_text())
    assert [[r["op"], r["peer"], r["bytes"]] for r in d["annotations"]["collectives"]] == log0
    assert [b for op, _, b in log0 if op == "c10d.recv_"][-2:] == [64, 64]


def test_torchrun_a_stage_given_its_shapes_skips_what_the_fake_group_makes_it_infer(tmp_path: Path) -> None:
    """Given its shapes, stage 0 of a real run reads 1 in the warm-up vote and sends only its two
    activations after it (the dispatcher's 4 ops, the stage module run once per microbatch); under
    the fake group the vote's receive is never filled, stage 0 reads 0 and infers the shapes (a
    third forward, two more sends). The fake graph is that run's, and a note says the value it read
    was never sent."""
    proc = _torchrun_json(f"{Path(__file__)}:static_stage_factory", timeout=120,
                          FXVIZ_TEST_C10D=str(tmp_path / "c10d"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    real = fxviz.Graph.from_json(proc.stdout)
    torch0 = json.loads((tmp_path / "c10d.0").read_text())
    assert [[r["op"], r["peer"], r["bytes"]] for r in real.annotations["collectives"]] == torch0
    assert [op for op, _, _ in torch0] == ["c10d.send", "c10d.recv_", "c10d.send", "c10d.send"]
    assert not any("delivers nothing" in n for n in real.notes)
    log = C10dLog()
    with log:
        fake = fxviz.capture(static_stage_factory, world_size=2)
    assert [[r["op"], r["peer"], r["bytes"]] for r in fake.annotations["collectives"]] == [list(o) for o in log.ops]
    assert len(log.ops) == 6
    assert [n.meta.value for n in fake.ops if n.target == "Tensor.item"] == ["0"]  # type: ignore[union-attr]
    assert [n.meta.value for n in real.ops if n.target == "Tensor.item"] == ["1"]  # type: ignore[union-attr]
    assert (len(tree_of(real).calls("part")), len(tree_of(fake).calls("part"))) == (2, 3)
    assert any(n.startswith("the fake process group delivers nothing to a receive") for n in fake.notes)


def test_torchrun_a_schedule_with_a_loss_runs_as_the_hint_says(tmp_path: Path) -> None:
    """The step the fake group refuses (a loss_fn: stage 0 takes the next stage's gradient metadata)
    runs on real ranks, as the hint says, inside ``enable_grad``: rank 0's sends and receives, the
    gradients' included, are the dispatcher's, and each met its receive on rank 1. The ``Work`` each
    ``isend`` returns and the group it is given show without their address: the JSON of two runs is
    the same (it held ``<... object at 0x7f...>``)."""
    proc = _torchrun_json(f"{Path(__file__)}:loss_stage_factory", timeout=120, FXVIZ_TEST_C10D=str(tmp_path / "c10d"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = json.loads(proc.stdout)
    torch0 = json.loads((tmp_path / "c10d.0").read_text())
    assert [[r["op"], r["peer"], r["bytes"]] for r in d["annotations"]["collectives"]] == torch0
    assert [b for op, _, b in torch0 if op == "c10d.recv_"][-2:] == [64, 64]  # each microbatch's gradient
    assert d["annotations"]["rank_mismatches"] == []
    # the backward the step ran on rank 0, node by node as torch's profiler saw it, each microbatch's
    # first node reading the gradient rank 0 received for it
    g = fxviz.Graph.from_json(proc.stdout)
    backward = [n for n in g.nodes if n.phase == "backward"]
    assert [n.target for n in backward] == json.loads((tmp_path / "c10d.autograd.0").read_text())
    recvs = [n.name for n in g.ops if n.target.endswith("irecv")][-2:]
    assert [n.inputs[0].node for n in backward if n.target == "ReluBackward0"] == recvs
    assert " at 0x" not in proc.stdout and "Work object>" in proc.stdout


class ZeroBubble(nn.Module):
    """A zero-bubble schedule (``ScheduleZBVZeroBubble``: two stages per rank in a V, rank 0 holds
    the first and the last) with a loss_fn, its step inside ``torch.enable_grad()``: each
    microbatch's backward is split into the input's gradient and, later, the weights'
    (``stage_backward_input`` / ``stage_backward_weight``, ``torch.autograd.grad`` calls, not
    ``backward``). Writes the dispatcher's c10d ops and the profiler's autograd nodes as
    :class:`StaticStage` does."""

    def __init__(self) -> None:
        super().__init__()
        from torch.distributed.pipelining import PipelineStage, ScheduleZBVZeroBubble

        self.rank = rank = dist.get_rank()
        self.parts = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(2))
        stages = [PipelineStage(p, i, 4, torch.device("cpu")) for p, i in zip(self.parts, (rank, 3 - rank), strict=True)]
        self.schedule = ScheduleZBVZeroBubble(stages, n_microbatches=4, loss_fn=lambda o, t: (o - t).pow(2).mean())

    def forward(self, x: torch.Tensor) -> Any:
        target = torch.zeros(8, 8)
        with C10dLog() as log, torch.enable_grad(), torch.profiler.profile() as prof:
            out = self.schedule.step(x, target=target) if self.rank == 0 else self.schedule.step(target=target)
        _write_torch_records(self.rank, log, prof)
        return out


def zero_bubble_factory() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return ZeroBubble(), (torch.randn(8, 8),)


def test_torchrun_a_zero_bubble_schedule_is_rank_0s_step_as_torch_ran_it(tmp_path: Path) -> None:
    """Issue 22's pipeline stages with a zero-bubble schedule (ZBV, two stages per rank, which the
    fake group refuses): rank 0's sends and receives are the dispatcher's, in order and size, each
    met on rank 1. Its backward: the last stage's input passes (``torch.autograd.grad`` on tensors)
    were missing, as was every node after them; now each is the autograd nodes torch's profiler saw
    run, in torch's order. The weight passes (``grad`` on gradient edges only) reach no
    torch-function mode: what is missing is only theirs, and a note says so."""
    proc = _torchrun_json(f"{Path(__file__)}:zero_bubble_factory", timeout=120, FXVIZ_TEST_C10D=str(tmp_path / "c10d"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = json.loads(proc.stdout)
    torch0 = json.loads((tmp_path / "c10d.0").read_text())
    assert len(torch0) > 8 and [[r["op"], r["peer"], r["bytes"]] for r in d["annotations"]["collectives"]] == torch0
    assert d["annotations"]["rank_mismatches"] == []
    g = fxviz.Graph.from_json(proc.stdout)
    ours = [n.target for n in g.nodes if n.phase == "backward"]
    ran = json.loads((tmp_path / "c10d.autograd.0").read_text())
    left = iter(ran)
    assert all(any(x == y for y in left) for x in ours)  # in torch's order
    assert ours.count("MeanBackward0") == ran.count("MeanBackward0") >= 4  # each of the last stage's input passes
    assert ours.count("ReluBackward0") == ran.count("ReluBackward0") >= 8  # and of the first stage's backwards
    missing = Counter(ran) - Counter(ours)
    assert set(missing) == {"AddmmBackward0", "TBackward0", "AccumulateGrad"}  # the weight passes' nodes
    assert any(n.startswith("the forward ran backward passes torch hands to no torch-function mode") for n in g.notes)


class OtherCollective(nn.Module):
    """Rank 0 all-reduces where rank 1 broadcasts the same 32 bytes: the classic mismatched
    collective. torch's record: the ``c10d`` ops each rank dispatched, written to
    ``$FXVIZ_TEST_C10D.<rank>`` even though the op never returns."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rank = dist.get_rank()
        try:
            with C10dLog() as log:
                dist.all_reduce(x) if rank == 0 else dist.broadcast(x, 0)
        finally:
            Path(f"{os.environ['FXVIZ_TEST_C10D']}.{rank}").write_text(json.dumps(log.ops))
        return x


def other_collective_factory() -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    return OtherCollective(), (torch.ones(2, 4),)


def test_torchrun_ranks_that_issue_different_collectives_say_so_in_their_lines(tmp_path: Path) -> None:
    """Whichever rank's wait ends first (gloo's timeout), the other's collective loses its peer:
    its line was "the model raised ... Connection closed by peer ... GLHF!", as if the model had
    failed; and rank 0's line said only that its collective timed out, where the graph it writes
    knows that rank 1 issued a broadcast there. Rank 0's line now says which collective each rank
    issued, as the dispatcher saw them, and a rank whose peer ended says that."""
    proc = _torchrun_json(f"{Path(__file__)}:other_collective_factory", timeout=5,
                          FXVIZ_TEST_C10D=str(tmp_path / "c10d"))
    assert proc.returncode != 0
    torch_ops = [json.loads((tmp_path / f"c10d.{r}").read_text()) for r in (0, 1)]
    assert [[(op, b) for op, _, b in ops] for ops in torch_ops] == [[("c10d.allreduce_", 32)], [("c10d.broadcast_", 32)]]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 2 and not any("the model raised" in e for e in errors), proc.stderr[-3000:]
    [zero] = [e for e in errors if not e.startswith("error: rank 1 of 2: ")]
    assert zero.startswith("error: a collective never returned: all_reduce on group 0 (2 ranks)")
    assert zero.endswith("; the ranks issued different collectives: collective 1 on 0 is rank 0's all_reduce (32 B, "
                         "forward, the model), rank 1's broadcast (32 B, forward, the model)")
    d = json.loads(proc.stdout)
    assert [c["kind"] for c in d["annotations"]["collectives"]] == ["all_reduce"]
