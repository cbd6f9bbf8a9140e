"""``capture(backward=True)``: one training step, forward and backward, on both paths; saved
activations summed exactly; bad input in one line; the model left as found. Oracles: torch's own
records of the same step (``saved_tensors_hooks``, the ``grad_fn`` graph, the joint graph's ``seq_nr``)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

import fxviz
from fxviz.errors import CaptureError, ModelError
from fxviz.passes.overlays import overlays
from fxviz.torchbridge.training import LossError
from tests.backward_models import BadBackward, Branchy, Custom, Frozen, mlp, torch_step
from tests.statecheck import kept

PATHS = ("export", "eager")


@pytest.mark.parametrize("method", PATHS)
def test_mlp_saves_16384_bytes_and_each_backward_op_sits_in_its_forward_module(method: str) -> None:
    model, args = mlp()
    g = fxviz.capture(model, args, backward=True, method=method)
    assert sum(s.bytes for s in g.saved) == 16_384 == torch_step(model, args)[0]
    by_name = {n.name: n for n in g.nodes}
    backward = [n for n in g.ops if n.phase == "backward"]
    assert backward and all(n.phase == "forward" for n in g.ops[: g.ops.index(backward[0])])
    # torch links a backward op to the forward op it differentiates: seq_nr (joint), grad_fn (eager)
    fwd_of_seq = {n.attrs["seq_nr"]: n for n in g.ops if n.phase == "forward" and "seq_nr" in n.attrs}
    for n in backward:
        fwd = by_name[n.attrs["forward"]] if method == "eager" and "forward" in n.attrs else fwd_of_seq.get(n.attrs["seq_nr"])
        if fwd is not None:
            assert n.stack == fwd.stack, (n.name, fwd.name)
    assert {n.module for n in backward} == {"", "a", "act", "b"}
    grads = {n.attrs["grad_of"]: n for n in g.outputs if n.phase == "backward"}
    assert set(grads) == {name for name, _ in model.named_parameters()}
    for name, p in model.named_parameters():
        assert g.meta_of(grads[name].inputs[0]).shape == tuple(p.shape)
    # the overlays: per op, per module total and own, adding up to the records
    ov = overlays(g)
    assert ov["saved"]["nodes"] and sum(ov["saved"]["nodes"].values()) == 16_384
    assert ov["saved"]["modules"] == {"a#0": 0, "act#0": 8192, "b#0": 8192}
    assert ov["saved_own"]["modules"] == ov["saved"]["modules"]  # leaves: own is total
    assert set(ov["phase"]["nodes"].values()) == {"forward", "backward"}


def test_eager_backward_ops_are_torchs_autograd_nodes() -> None:
    model, args = mlp()
    g = fxviz.capture(model, args, backward=True, method="eager")
    assert sum(1 for n in g.ops if n.phase == "backward") == torch_step(model, args)[1]
    targets = [n.target for n in g.ops if n.phase == "backward"]
    assert targets == ["SumBackward0", "AddmmBackward0", "TBackward0", "GeluBackward0", "AddmmBackward0", "TBackward0"]


@pytest.mark.parametrize("method", PATHS)
def test_a_frozen_layer_has_no_gradient_and_is_marked(method: str) -> None:
    torch.manual_seed(0)
    model, x = Frozen(), torch.randn(5, 8)
    g = fxviz.capture(model, (x,), backward=True, method=method)
    grads = {n.attrs["grad_of"] for n in g.outputs if n.phase == "backward"}
    assert grads == {"head.weight", "head.bias"}
    assert {n.target for n in g.nodes if n.kind == "parameter" and n.attrs.get("frozen")} == {"stem.weight", "stem.bias"}
    assert not any(n.module == "stem" for n in g.ops if n.phase == "backward")
    assert sum(s.bytes for s in g.saved) == torch_step(model, (x,))[0]


def test_a_custom_autograd_function_is_one_backward_op_in_its_module() -> None:
    torch.manual_seed(0)
    model, x = Custom(), torch.randn(3, 8)
    g = fxviz.capture(model, (x,), backward=True, method="eager")
    sq = [n for n in g.ops if n.phase == "backward" and n.module == "sq"]
    assert [n.target for n in sq] == ["SquareBackward"]
    assert sum(s.bytes for s in g.saved) == torch_step(model, (x,))[0]
    assert any(s.module == "sq" and s.bytes == 3 * 8 * 4 for s in g.saved)  # ctx.save_for_backward(x)


def test_a_custom_autograd_function_is_not_differentiated_by_the_joint_graph() -> None:
    """Non-strict export inlines a custom Function's forward: the joint graph would differentiate
    its ops and never run its backward (a straight-through estimator would be silently wrong)."""
    torch.manual_seed(0)
    model, x = BadBackward(), torch.randn(2, 4)
    with pytest.raises(CaptureError) as info:
        fxviz.capture(model, (x,), backward=True, method="export")
    assert "custom autograd.Function Failing" in info.value.attempts[0].message
    g = fxviz.capture(Custom(), (x.new_ones(3, 8),), backward=True)
    assert [a.method for a in g.attempts] == ["export", "eager"] and g.method == "eager (backward)"


def test_a_data_dependent_branch_falls_back_to_the_eager_path() -> None:
    torch.manual_seed(0)
    model, x = Branchy(), torch.randn(2, 4)
    g = fxviz.capture(model, (x,), backward=True)
    assert [a.method for a in g.attempts] == ["export", "eager"] and not g.attempts[0].ok
    assert g.method == "eager (backward)"
    assert sum(1 for n in g.ops if n.phase == "backward") == torch_step(model, (x,))[1]
    assert sum(s.bytes for s in g.saved) == torch_step(model, (x,))[0]


@pytest.mark.parametrize("method", PATHS)
def test_the_model_is_left_as_found_grads_kept_not_accumulated(method: str) -> None:
    model, args = mlp()
    model.a.weight.grad = torch.ones_like(model.a.weight)
    with kept(model, args):
        fxviz.capture(model, args, backward=True, method=method)
    assert model.b.weight.grad is None and torch.equal(model.a.weight.grad, torch.ones_like(model.a.weight))


def test_no_parameter_requiring_grad_is_one_line() -> None:
    model, args = mlp()
    model.requires_grad_(False)
    with pytest.raises(LossError, match="no parameter of MLP requires grad"):
        fxviz.capture(model, args, backward=True)


class _Ints(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> int:
        return int(self.lin(x).argmax())


@pytest.mark.parametrize("method", ["auto", "eager"])
def test_an_output_without_a_floating_tensor_and_no_loss_is_one_line(method: str) -> None:
    with pytest.raises(LossError, match="holds no floating tensor.*loss=fn"):
        fxviz.capture(_Ints(), (torch.randn(1, 2),), backward=True, method=method)


@pytest.mark.parametrize("method", ["auto", "eager"])
def test_a_loss_that_is_not_a_scalar_is_one_line(method: str) -> None:
    model, args = mlp()
    with pytest.raises(LossError, match=r"shape \[32, 8\], not a scalar"):
        fxviz.capture(model, args, backward=True, method=method, loss=lambda out: out * 2)


def test_a_given_loss_is_differentiated() -> None:
    model, args = mlp()
    g = fxviz.capture(model, args, backward=True, method="eager", loss=lambda out: out.pow(2).mean())
    assert [n.target for n in g.ops if n.phase == "backward"][:2] == ["MeanBackward0", "PowBackward0"]


def test_a_backward_that_raises_keeps_the_forward_graph_with_the_error() -> None:
    torch.manual_seed(0)
    model, x = BadBackward(), torch.randn(2, 4)
    with pytest.raises(ModelError, match="this backward is broken") as info:
        fxviz.capture(model, (x,), backward=True, method="eager")
    g = info.value.graph
    assert g is not None and "backward raised" in (g.error or "")
    assert any(n.target == "torch.nn.functional.linear" for n in g.ops)
    failed = [n for n in g.nodes if n.error]
    assert [n.target for n in failed] == ["FailingBackward"]


@pytest.mark.parametrize("method", PATHS)
def test_a_model_on_meta_saves_what_the_real_one_does(method: str) -> None:
    """On ``meta`` every data pointer is 0: storages are told apart by their own identity."""
    from tests.backward_models import MLP

    with torch.device("meta"):
        model = MLP()
    g = fxviz.capture(model, (torch.randn(32, 16, device="meta"),), backward=True, method=method)
    assert sum(s.bytes for s in g.saved) == 16_384
    assert [s.bytes for s in g.saved if s.bytes] == [8192, 8192]


@pytest.mark.parametrize("method", PATHS)
@pytest.mark.parametrize("build", ["checkpoint", "batchnorm"])
def test_checkpoint_and_train_mode_batchnorm(build: str, method: str) -> None:
    from tests.backward_models import BatchNormCNN, Checkpointed

    torch.manual_seed(0)
    model, x = (Checkpointed(), torch.randn(4, 8)) if build == "checkpoint" else (BatchNormCNN().train(), torch.randn(2, 3, 8, 8))
    total, fns = torch_step(model, (x,))
    with kept(model, (x,)):
        g = fxviz.capture(model, (x,), backward=True, method=method)
    saved = sum(s.bytes for s in g.saved)
    if method == "eager":
        assert saved == total and sum(1 for n in g.ops if n.phase == "backward") == fns
    elif build == "checkpoint":  # the joint graph of strict export, its checkpoint region recomputed
        assert saved == total and [n.module for n in g.nodes if n.phase == "recompute"] == ["a.lin", "a.lin", "a", "a"]  # t, addmm, tanh and its detach
    else:  # the joint graph's: the running statistics eager updates in place are buffers
        assert saved == total
    assert {n.attrs["grad_of"] for n in g.outputs if n.phase == "backward"} == {n for n, _ in model.named_parameters()}


class _Residual(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.f = torch.nn.Linear(4, 4)
        self.g = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.f(x)
        return h + self.g(h)


def test_a_call_keeps_its_forward_structure_with_its_backward_ops_after_it() -> None:
    """Backward ops read gradients from child calls and values from the forward: left in with the
    forward steps they tied every step of a call together (GPT-2's blocks no longer folded)."""
    from fxviz.passes.structure import Op, Parallel, structure

    torch.manual_seed(0)
    model, x = _Residual(), torch.randn(2, 4)

    def shape(steps: list) -> list:
        return [("par", s.residual) if isinstance(s, Parallel) else ("op", s.node) if isinstance(s, Op)
                else ("call", s.path) for s in steps]

    fwd = shape(structure(fxviz.capture(model, (x,), method="eager")).steps)
    g = fxviz.capture(model, (x,), backward=True, method="eager")
    steps = shape(structure(g).steps)
    assert steps[: len(fwd)] == fwd and ("par", True) in fwd
    assert all(kind == "op" and g.node(name).phase == "backward" for kind, name in steps[len(fwd):] if kind == "op"
               and name not in ("sum",))


def test_the_cli_takes_a_loss_function(tmp_path: Path) -> None:
    """``--loss FILE.py:FN`` (implies ``--backward``) differentiates that loss, as ``capture(loss=fn)``
    does; a name that is not a function is one line."""
    import json

    from click.testing import CliRunner

    from fxviz.cli import cli

    p = tmp_path / "net.py"
    p.write_text(textwrap.dedent("""
        import torch
        from torch import nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.a = nn.Linear(8, 16)
                self.b = nn.Linear(16, 4)

            def forward(self, x):
                return {"logits": self.b(torch.relu(self.a(x))), "aux": self.a(x)}

        def build():
            torch.manual_seed(0)
            return Net(), (torch.randn(2, 8),)

        def ce(out):
            return torch.nn.functional.cross_entropy(out["logits"], torch.tensor([1, 2]))
    """))
    res = CliRunner().invoke(cli, ["json", f"{p}:build", "--loss", f"{p}:ce", "-m", "eager"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    backward = [n["target"] for n in d["nodes"] if n.get("phase") == "backward" and n["kind"] == "op"]
    assert backward[:2] == ["NllLossBackward0", "LogSoftmaxBackward0"], backward
    # the default loss (the sum of both outputs) would differentiate aux too: a's addmm twice
    assert backward.count("AddmmBackward0") == 2
    for bad, says in ((f"{p}:nope", f"{p} has no function 'nope'"), ("ce", "is not a function: give file.py:name")):
        res = CliRunner().invoke(cli, ["tree", f"{p}:build", "--loss", bad])
        assert res.exit_code != 0 and says in res.output.strip().splitlines()[-1], res.output
        assert "Traceback" not in res.output
