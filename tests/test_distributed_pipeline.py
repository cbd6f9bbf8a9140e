"""Pipeline stages (``torch.distributed.pipelining``) under ``--world-size`` (issue 22, works on: a
sequence of pipeline stages). The fake process group makes this process rank 0, so the capture is
stage 0's step; its receives deliver nothing (the fake work writes no buffer). torch's record of
the run is the dispatcher's ``c10d`` ops (:class:`~tests.test_distributed_p2p.C10dLog`:
``CommDebugMode`` counts no point-to-point op, and its module tracker fails inside a schedule's
step) and the stage module's own forward hooks.
"""

from __future__ import annotations

import traceback
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

import fxviz
from fxviz.errors import ModelError
from fxviz.passes.comm import collectives
from fxviz.passes.tree import tree_of
from fxviz.render.tree import tree_text
from fxviz.torchbridge.distributed import end_world, fake_world
from fxviz.torchbridge.training import LossError
from tests.test_distributed_p2p import C10dLog


class Twice(torch.autograd.Function):
    """A custom autograd Function: its backward is Python code the autograd engine calls."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return grad * 2 + x * 0


class Doubled(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return Twice.apply(x)  # type: ignore[no-any-return]


class Step(nn.Module):
    """One step of this rank's stage (GPipe, two microbatches), as training code calls it; with
    ``loss`` the schedule runs the backward too, inside ``torch.enable_grad()`` when ``grad``;
    ``custom``: the stage's second layer is a custom autograd Function's (:class:`Twice`)."""

    def __init__(self, loss: bool = False, grad: bool = False, static: bool = False, custom: bool = False) -> None:
        super().__init__()
        from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

        self.part = nn.Sequential(nn.Linear(8, 8), Doubled() if custom else nn.ReLU())
        shapes: dict[str, Any] = {"input_args": torch.empty(2, 8), "output_args": torch.empty(2, 8)} if static else {}
        stage = PipelineStage(self.part, dist.get_rank(), dist.get_world_size(), torch.device("cpu"), **shapes)
        self.schedule = ScheduleGPipe(stage, n_microbatches=2,
                                      loss_fn=(lambda o, t: (o - t).pow(2).mean()) if loss else None)
        self.loss, self.grad = loss, grad

    def forward(self, x: torch.Tensor) -> Any:
        with torch.enable_grad() if self.grad else torch.autograd.grad_mode.set_grad_enabled(torch.is_grad_enabled()):
            return self.schedule.step(x, target=torch.zeros(4, 8)) if self.loss else self.schedule.step(x)


def forward_factory() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return Step(), (torch.randn(4, 8),)


def loss_factory() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return Step(loss=True, grad=True), (torch.randn(4, 8),)


def loss_no_grad_factory() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return Step(loss=True), (torch.randn(4, 8),)


class Looped(nn.Module):
    """Two stages per rank (``ScheduleLoopedBFS``, forward only): rank 0 holds stages 0 and 2."""

    def __init__(self) -> None:
        super().__init__()
        from torch.distributed.pipelining import PipelineStage, ScheduleLoopedBFS

        rank, world = dist.get_rank(), dist.get_world_size()
        self.parts = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])
        stages = [PipelineStage(p, rank + i * world, 2 * world, torch.device("cpu")) for i, p in enumerate(self.parts)]
        self.schedule = ScheduleLoopedBFS(stages, n_microbatches=2)

    def forward(self, x: torch.Tensor) -> Any:
        return self.schedule.step(x)


def looped_factory() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return Looped(), (torch.randn(4, 8),)


def test_a_forward_schedule_is_stage_0s_step_as_the_dispatcher_and_hooks_saw_it() -> None:
    """Every send and receive of stage 0 (the warm-up vote, the shape inference's metadata, each
    microbatch's activations) is the dispatcher's, and the stage module ran as often as its hooks
    say (the inference's forward and one per microbatch). The vote's receive, read as 0 by the
    schedule, is said to be a value nobody sent; the ``isend``'s ``Work`` shows no address."""
    calls: list[int] = []
    with fake_world(2):
        model, args = forward_factory()
        model.part.register_forward_hook(lambda *_: calls.append(1))
        with C10dLog() as torch_log:
            model(*args)
    log = C10dLog()
    with log:
        g = fxviz.capture(forward_factory, world_size=2)
    assert not dist.is_initialized()
    assert log.ops == torch_log.ops
    recs = collectives(g)
    assert [(r["op"], r["peer"], r["bytes"]) for r in recs] == log.ops
    assert [r["kind"] for r in recs] == ["send", "recv", "send", "send", "send", "send"]
    assert [r.get("unfilled", False) for r in recs] == [False, True, False, False, False, False]
    assert len(tree_of(g).calls("part")) == len(calls) == 3
    [note] = [n for n in g.notes if n.startswith("the fake process group delivers nothing")]
    assert "read 1 received value in Python (item = 0 at test_distributed_pipeline.py:" in note
    assert " at 0x" not in g.to_json()


@pytest.mark.parametrize(("factory", "fails_in", "said"), [
    (loss_factory, "_backward_metadata_inference",
     "a pipeline schedule (torch.distributed.pipelining) with a loss_fn cannot run its step under the fake process "
     "group: rank 0's stage takes the next stage's gradient metadata from it (recv_object_list), and fake receives "
     "deliver nothing; launch it with torchrun --nproc-per-node 2, or give the schedule no loss_fn to capture its "
     "forward here"),
    (looped_factory, "_forward_metadata_inference",
     "a pipeline schedule (torch.distributed.pipelining) with several stages per rank cannot run under the fake "
     "process group: a later stage on rank 0 takes its inputs' metadata from the stage before it, on another rank "
     "(recv_object_list), and fake receives deliver nothing; launch it with torchrun --nproc-per-node 2, or capture "
     "a schedule of one stage per rank here (rank 0's is stage 0)"),
    (loss_no_grad_factory, "step",
     "a pipeline schedule with a loss_fn runs its backward in step(), refused under the torch.no_grad() fxviz "
     "records a forward in: call step() inside `with torch.enable_grad():` in the model's forward; under the fake "
     "process group it then fails where rank 0's stage takes the next stage's metadata (recv_object_list: fake "
     "receives deliver nothing): launch it with torchrun --nproc-per-node 2"),
])
def test_a_schedule_the_fake_group_cannot_run_is_one_line_that_says_what_to_do(factory: Any, fails_in: str,
                                                                                said: str) -> None:
    """torch's own step fails under the fake group: in ``recv_object_list``, where stage 0 unpickles
    the next stage's gradient metadata (a ``loss_fn``) or a later stage on rank 0 the previous
    stage's output metadata (several stages per rank), that nobody sent (an empty buffer, or a
    size read from garbage); or, under ``no_grad`` as fxviz records a forward, in ``step()``
    itself. fxviz said torch's words (``EOFError: Ran out of input``, an allocation of terabytes,
    "should not be used under torch.no_grad() context. Please call eval()"); now one line that
    says what to do, the partial graph kept with the sends and receives the dispatcher saw."""
    with fake_world(2), torch.no_grad():
        model, args = factory()
        with pytest.raises(Exception) as own:  # noqa: PT011 - torch's error depends on the buffer's garbage
            model(*args)
    frames = [f.name for f in traceback.extract_tb(own.value.__traceback__)]
    assert fails_in in frames and (fails_in == "step" or "recv_object_list" in frames)
    log = C10dLog()
    with log, pytest.raises(ModelError) as e:
        fxviz.capture(factory, world_size=2)
    assert str(e.value) == said
    assert e.value.graph is not None
    assert [(r["op"], r["peer"], r["bytes"]) for r in collectives(e.value.graph)] == log.ops
    assert not dist.is_initialized()


def test_the_no_grad_hint_on_a_real_group_does_not_blame_the_fake_one(tmp_path: Any) -> None:
    """On a real group (gloo, a caller's, one rank: a single stage) the schedule's step under
    fxviz's ``no_grad`` is told to call step() inside ``enable_grad``, and so called it runs."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        with pytest.raises(ModelError) as e:
            fxviz.capture(loss_no_grad_factory, world_size=1)
        assert str(e.value).startswith("a pipeline schedule with a loss_fn runs its backward in step()")
        assert "fake" not in str(e.value)
        g = fxviz.capture(loss_factory, world_size=1)
        assert len(tree_of(g).calls("part")) == 3  # the shape inference's forward and two microbatches
        assert dist.is_initialized()  # the caller's group, left as it was
    finally:
        end_world()


def custom_loss_factory() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return Step(loss=True, grad=True, custom=True), (torch.randn(4, 8),)


def test_the_backward_a_schedule_runs_in_its_step_is_the_autograd_nodes_torch_ran(tmp_path: Any) -> None:
    """A schedule with a loss_fn runs each microbatch's backward inside ``step()``, in C++ where no
    torch-function mode looks: the graph had the step's forward ops and nothing of its backward,
    not even the custom Function's (``TwiceBackward``, which ``capture(backward=True)`` of the
    unpipelined stage shows). Now each autograd node the step ran is a backward node, in the order
    torch's profiler recorded them running (``autograd::engine::evaluate_function``), the custom
    Function's in the module call that ran its forward, for each microbatch (the stage module's
    calls 2 and 3: the forward hooks saw the shape inference's call first), and the gradients
    accumulate into the stage's parameters. A real group (gloo, one rank: a single stage)."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model, args = custom_loss_factory()
        calls: list[int] = []
        model.part.register_forward_hook(lambda *_: calls.append(1))
        with torch.profiler.profile() as prof:
            model(*args)
        ran = sorted((e for e in prof.events() if e.name.startswith("autograd::engine::evaluate_function: ")),
                     key=lambda e: e.time_range.start)
        torch_ran = [e.name.split(": ", 1)[1].removeprefix("torch::autograd::") for e in ran]
        assert torch_ran.count("TwiceBackward") == 2 and len(calls) == 3
        g = fxviz.capture(custom_loss_factory, world_size=1)
        backward = [n for n in g.nodes if n.phase == "backward"]
        assert [n.target for n in backward] == torch_ran
        twice = [n for n in backward if n.target == "TwiceBackward"]
        assert [n.stack[-1] for n in twice] == [("part.1", 1), ("part.1", 2)]
        assert all(n.attrs["forward"] == g.node(n.attrs["forward"]).name and
                   g.node(n.attrs["forward"]).stack == n.stack for n in twice)
        assert {n.attrs["grad_of"] for n in backward if n.target == "AccumulateGrad"} == {"part.0.weight",
                                                                                          "part.0.bias"}
        assert [n.outputs[0].shape for n in twice] == [(2, 8), (2, 8)]  # the gradient each handed on
        plain = fxviz.capture(Doubled(), (torch.randn(2, 8, requires_grad=True),), method="eager", backward=True)
        assert "TwiceBackward" in {n.target for n in plain.nodes if n.phase == "backward"}
        # backward=True differentiates the step's output again, after the step's own backward freed its graph:
        # torch's error in the backward was all fxviz said; now what to do, the forward graph kept
        with pytest.raises(ModelError) as e:
            fxviz.capture(custom_loss_factory, world_size=1, backward=True)
        assert str(e.value) == (
            "the model's forward ran a backward itself (2 torch.autograd.backward or grad calls: a pipeline schedule's "
            "step with a loss_fn runs each microbatch's), which freed the graph backward=True differentiates again: capture "
            "it without backward=True; that graph has the backward the forward ran, node by node")
        assert isinstance(e.value.__cause__, RuntimeError) and "a second time" in str(e.value.__cause__)
        assert e.value.graph is not None and e.value.graph.error.startswith("the backward raised RuntimeError")
    finally:
        end_world()


class Raises(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError("the stage's own error")


def test_a_call_whose_result_nobody_reads_returned_and_only_one_that_raised_is_marked() -> None:
    """The shape inference runs the stage module and reads only its output's shape: no op reads
    its result, and the tree drew it as a call that raised (``→ ✗``). torch's forward hooks say it
    returned (a hook runs after a forward that returns); it is ``→ unread``, and ``✗`` stays on
    the call that raised (its hook never ran)."""
    returned: list[torch.Size] = []
    with fake_world(2):
        model, args = forward_factory()
        model.part.register_forward_hook(lambda _m, _i, out: returned.append(out.shape))
        model(*args)
    assert returned == [torch.Size([2, 8])] * 3
    text = tree_text(fxviz.capture(forward_factory, world_size=2), width=200, unfold=True)
    assert "part (Sequential) call 1/3  [2, 8] → unread" in text and "✗" not in text

    def raising() -> tuple[nn.Module, tuple[torch.Tensor]]:
        torch.manual_seed(0)
        step = Step()
        step.part.append(Raises())
        return step, (torch.randn(4, 8),)

    hooked: list[int] = []
    with fake_world(2):
        model, args = raising()
        model.part.register_forward_hook(lambda *_: hooked.append(1))
        with pytest.raises(ValueError, match="the stage.s own error"):
            model(*args)
    assert hooked == []
    with pytest.raises(ModelError) as e:
        fxviz.capture(raising, world_size=2)
    assert e.value.graph is not None
    assert "part (Sequential)  [2, 8] → ✗" in tree_text(e.value.graph, width=200, unfold=True)


class ReceivesObjects(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        got: list[Any] = [None]
        dist.recv_object_list(got, src=1)
        return x * 2


def test_a_receive_of_python_objects_is_one_line() -> None:
    """``dist.recv_object_list`` outside a schedule: torch's own run under the fake group fails in
    it (a size nobody sent, so no bytes to unpickle); fxviz said torch's words, now what to do."""
    with fake_world(2), pytest.raises(Exception) as own:  # noqa: PT011 - torch's error: the buffer's garbage
        ReceivesObjects()(torch.ones(2))
    assert "recv_object_list" in [f.name for f in traceback.extract_tb(own.value.__traceback__)]
    with pytest.raises(ModelError) as e:
        fxviz.capture(lambda: (ReceivesObjects(), (torch.ones(2),)), world_size=2)
    assert str(e.value) == ("dist.recv_object_list cannot run under the fake process group: no rank sends, so it "
                            "unpickles bytes nobody sent; run on real ranks (torchrun --nproc-per-node 2), where the "
                            "other rank sends them")
    assert e.value.graph is not None and [r["kind"] for r in collectives(e.value.graph)][:1] == ["recv"]


class SelfTrain(nn.Module):
    """A forward that runs its own backward, as a pipeline schedule's last stage does, and returns
    ``None`` (rank 0 of a schedule with a loss_fn) or the detached loss (the last stage's)."""

    def __init__(self, returns: str) -> None:
        super().__init__()
        self.lin, self.returns = nn.Linear(4, 4), returns

    def forward(self, x: torch.Tensor) -> Any:
        with torch.enable_grad():
            loss = self.lin(x).pow(2).mean()
            loss.backward()
        return None if self.returns == "none" else loss.detach()


@pytest.mark.parametrize("returns", ["none", "detached"])
def test_backward_true_on_a_forward_that_ran_its_own_backward_says_to_drop_it(returns: str) -> None:
    """Under torchrun, ``--backward`` on a zero-bubble schedule's step said "the model's output
    (NoneType) holds no floating tensor ...: pass loss=fn" on rank 0 and "the loss does not depend
    on any parameter" on the last rank: a loss would not help, the step had run its backward. Now
    both say so, as the freed-graph case does; without backward=True the graph holds the backward
    torch ran (its profiler's autograd nodes, in order)."""
    torch.manual_seed(0)
    model, x = SelfTrain(returns), torch.randn(2, 4)
    with pytest.raises(LossError) as e:
        fxviz.capture(model, (x,), method="eager", backward=True)
    assert str(e.value) == (
        "the model's forward ran a backward itself (1 torch.autograd.backward or grad calls: a pipeline schedule's step "
        "with a loss_fn runs each microbatch's), and returned no loss for backward=True to differentiate again: capture it "
        "without backward=True; that graph has the backward the forward ran, node by node")
    with torch.profiler.profile() as prof:
        model(x)
    ran = sorted((ev for ev in prof.events() if ev.name.startswith("autograd::engine::evaluate_function: ")),
                 key=lambda ev: ev.time_range.start)
    g = fxviz.capture(model, (x,), method="eager")
    assert [n.target for n in g.nodes if n.phase == "backward"] == [
        ev.name.split(": ", 1)[1].removeprefix("torch::autograd::") for ev in ran]


class Grads(nn.Module):
    """A forward that takes gradients itself, as a zero-bubble schedule's stage does: the input's
    with ``torch.autograd.grad`` on tensors, then the weights' on gradient edges only."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.autograd.graph import get_gradient_edge

        with torch.enable_grad():
            x = x.detach().requires_grad_()
            y = self.lin(x).relu().sum()
            (gx,) = torch.autograd.grad(y, x, retain_graph=True)
            weights = [get_gradient_edge(self.lin.weight), get_gradient_edge(self.lin.bias)]
            gw = torch.autograd.grad([get_gradient_edge(y)], weights, grad_outputs=[torch.ones(())])
        return gx + gw[0].sum()


def test_a_grad_the_forward_takes_is_the_nodes_torch_ran_and_one_it_cannot_see_is_said() -> None:
    """``torch.autograd.grad`` in the forward was an op named ``grad`` with nothing of its backward;
    now its autograd nodes are the graph's, as torch's profiler saw them run: only those that lead
    to the input (not the weights' ``TBackward0`` and accumulators), the input's accumulator
    returning its gradient. The weights' pass, given gradient edges only, reaches no torch-function
    mode: it is not in the graph, and a note says so."""
    torch.manual_seed(0)
    model, x = Grads(), torch.randn(2, 4)
    with torch.profiler.profile() as prof:
        model(x)
    ran = [ev.name.split(": ", 1)[1].removeprefix("torch::autograd::") for ev in sorted(
        (ev for ev in prof.events() if ev.name.startswith("autograd::engine::evaluate_function: ")),
        key=lambda ev: ev.time_range.start)]
    assert ran == ["SumBackward0", "ReluBackward0", "AddmmBackward0", "AccumulateGrad",  # the input's pass
                   "SumBackward0", "ReluBackward0", "AddmmBackward0", "AccumulateGrad", "TBackward0", "AccumulateGrad"]
    g = fxviz.capture(model, (x,), method="eager")
    backward = [n for n in g.nodes if n.phase == "backward"]
    assert [n.target for n in backward] == ran[:4]
    assert [n.attrs.get("returned", False) for n in backward] == [False, False, False, True]
    assert backward[-1].attrs["grad_of"] == "Tensor.requires_grad_"  # the op that made the leaf x
    assert [n for n in g.notes if "torch hands to no torch-function mode" in n] == [
        "the forward ran backward passes torch hands to no torch-function mode (torch.autograd.grad given gradient "
        "edges only, as a zero-bubble pipeline schedule's weight passes are): at least 3 autograd nodes ran in them "
        "that the graph does not show; torch's profiler lists every node that ran (autograd::engine::evaluate_function)"]
