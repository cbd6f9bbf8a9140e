"""What a training capture says, checked against torch's own record of the same step: the real
backward (does it raise?), ``saved_tensors_hooks`` with the module running at each pack (which
module's op saved what), the joint graph's own descriptors. Each test is a discrepancy fxviz had."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
from torch import nn

import fxviz
from fxviz.errors import ModelError
from tests.backward_models import default_loss


def torch_saved_by_module(model: nn.Module, args: tuple[Any, ...],
                          kwargs: dict[str, Any] | None = None) -> Counter[str]:
    """Bytes autograd saves in a real step per module path (the innermost module running when the
    tensor is packed), each storage once, no parameter, buffer or input: torch's own record."""
    paths = {id(m): p for p, m in model.named_modules()}
    stack: list[str] = []

    def pre(m: nn.Module, _a: Any) -> None:
        stack.append(paths.get(id(m), ""))

    def post(_m: nn.Module, _a: Any, _o: Any) -> None:
        stack.pop()

    kwargs = kwargs or {}
    inputs = [t for t in [*args, *kwargs.values()] if isinstance(t, torch.Tensor)]
    own = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers(), *inputs]}
    seen: set[int] = set()
    per: Counter[str] = Counter()

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = t.untyped_storage().data_ptr()
        if key not in own and key not in seen:
            seen.add(key)
            per[stack[-1] if stack else ""] += t.untyped_storage().nbytes()
        return t

    hooks = [nn.modules.module.register_module_forward_pre_hook(pre), nn.modules.module.register_module_forward_hook(post)]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            default_loss(model(*args, **kwargs))
    finally:
        for h in hooks:
            h.remove()
    return +per


def fxviz_saved_by_module(g: fxviz.Graph) -> Counter[str]:
    per: Counter[str] = Counter()
    for s in g.saved:
        per[s.module] += s.bytes
    return +per


class InPlaceAfterSave(nn.Module):
    """``relu_`` saves its result; ``mul_`` then changes it: the real backward refuses the step."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(8, 8)
        self.l2 = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.l1(x)
        y.relu_()
        y.mul_(2.0)
        return torch.sigmoid(self.l2(y))


@pytest.mark.parametrize("method", ["eager", "auto"])
def test_a_saved_tensor_changed_in_place_fails_the_backward_as_torchs_does(method: str) -> None:
    """``saved_tensors_hooks`` turn off autograd's version check: the eager path ran a backward (with
    wrong gradients) that torch's own step refuses."""
    torch.manual_seed(0)
    model, x = InPlaceAfterSave(), torch.randn(4, 8)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        default_loss(model(x)).backward()  # torch's own record of the step
    model.zero_grad(set_to_none=True)
    with pytest.raises(ModelError, match="modified by an inplace operation.*ReluBackward0") as info:
        fxviz.capture(model, (x,), backward=True, method=method)
    g = info.value.graph
    assert g is not None and [n.target for n in g.nodes if n.error] == ["ReluBackward0"]
    assert all(p.grad is None for p in model.parameters())


class Detached(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.lin(x).detach(), x * 2


@pytest.mark.parametrize("loss", [None, lambda out: out[1].sum(), lambda out: out[0].argmax()],
                         ids=["detached output", "a loss of the input alone", "an integer loss"])
@pytest.mark.parametrize("method", ["export", "auto"])
def test_a_loss_that_reads_nothing_trainable_is_one_line_on_the_export_path(method: str, loss: Any) -> None:
    """The joint graph of such a loss has no backward at all: it was drawn as a training step with no
    backward op and no gradient, where torch's own autograd has nothing to run."""
    from fxviz.torchbridge.training import LossError

    model, x = Detached(), torch.randn(2, 4)
    value = (loss or default_loss)(model(x))
    assert value.grad_fn is None  # torch's record: nothing to differentiate
    with pytest.raises(LossError, match="does not depend on any parameter or input that requires grad"):
        fxviz.capture(model, (x,), backward=True, method=method, loss=loss)


class ConvBN(nn.Module):
    """A train-mode batch norm (running statistics updated in place, an integer counter bumped after
    the convolution's autograd node), then a functional ReLU whose output a convolution reads."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c2(torch.relu(self.bn(self.c1(x))))


def test_the_joint_graphs_saved_records_are_torchs_per_module_and_per_op() -> None:
    """Three ways the export path's records differed from what torch packs in the same step: the
    batch norm's running statistics (updated in place by eager, so a buffer: 0 bytes) counted as new
    memory; the convolution's saved input and weight said to be saved by the batch norm's counter
    update (the last op tagged with the convolution's ``seq_nr``); and the ReLU's output counted
    under the convolution that reads it, not under the ReLU that saves it first."""
    torch.manual_seed(0)
    model, x = ConvBN().train(), torch.randn(2, 3, 8, 8)
    expected = torch_saved_by_module(model, (x,))
    assert expected == {"bn": 4096 + 2 * 32, "": 4096}  # conv out; mean, invstd; the ReLU's output
    for method in ("eager", "export"):
        g = fxviz.capture(model, (x,), backward=True, method=method)
        assert fxviz_saved_by_module(g) == expected, method
        by_name = {n.name: n for n in g.nodes}
        savers = {(s.value, s.shares): by_name[s.node] for s in g.saved if s.shares in ("parameter", "input", "buffer")}
        conv_in = savers[("x", "input")]
        assert conv_in.module == "c1" and "conv" in conv_in.target, (method, conv_in.name, conv_in.target)
        running = [s for s in g.saved if s.shape == (8,) and s.shares == "buffer"]
        assert len(running) == 2 and {s.module for s in running} == {"bn"}, method
        if method == "export":  # what the step writes back into the buffers, by name
            assert {o.target for o in g.outputs if o.target.startswith("bn.")} == {
                "bn.running_mean (updated)", "bn.running_var (updated)", "bn.num_batches_tracked (updated)"}


class TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.c = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.tanh(self.a(x))
        return self.c(h), torch.sigmoid(self.b(h))


def test_an_output_the_loss_does_not_read_is_named_where_the_joint_graph_leaves_it_out() -> None:
    """Eager autograd saves for every output (``saved_tensors_hooks`` sees the second head's
    sigmoid), the joint graph keeps only what the loss needs: the export path counted half of torch's
    bytes and drew no op of head ``b``, without a word."""
    torch.manual_seed(0)
    model, x = TwoHeads(), torch.randn(4, 8)
    packed: list[int] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t.untyped_storage().nbytes()) or t, lambda t: t):
        out = model(x)
    assert out[1].grad_fn is not None and sum(packed[-1:]) == 128  # the sigmoid's output, saved
    ge = fxviz.capture(model, (x,), backward=True, method="eager", loss=lambda o: o[0].sum())
    gx = fxviz.capture(model, (x,), backward=True, method="export", loss=lambda o: o[0].sum())
    assert sum(s.bytes for s in ge.saved) == 256 and sum(s.bytes for s in gx.saved) == 128
    assert not any(n.module == "b" for n in gx.ops)
    said = [n for n in gx.notes if "does not read" in n]
    assert len(said) == 1 and "output[1]" in said[0] and "output[0]" not in said[0]
    both = fxviz.capture(model, (x,), backward=True, method="export")
    assert not any("does not read" in n for n in both.notes)


@pytest.mark.parametrize("loss", [lambda y: float(y.sum()), lambda y: y.sum().item(), lambda y: int(y.sum()),
                                  lambda y: bool(y.sum() > 0)], ids=["float()", ".item()", "int()", "bool()"])
@pytest.mark.parametrize("method", ["export", "eager", "auto"])
def test_a_loss_that_returns_a_python_number_says_so_on_every_path(method: str, loss: Any) -> None:
    """The export path runs the loss on traced values: ``float(y.sum())`` failed there with export's
    "Could not guard on data-dependent expression zuf0", and ``.item()`` said the loss returned
    ``SymFloat``, a type the user's code never makes. Every path names what the loss returns on
    the real output."""
    from fxviz.torchbridge.training import LossError

    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(4, 4)), torch.randn(2, 4)
    kind = type(loss(model(x))).__name__  # torch's own run of the step's forward and loss
    assert kind in ("float", "int", "bool")
    with pytest.raises(LossError, match=f"^loss returned {kind}, not a tensor: return a scalar tensor$"):
        fxviz.capture(model, (x,), backward=True, method=method, loss=loss)


def test_a_loss_that_branches_on_data_but_returns_a_tensor_is_exports_own_failure() -> None:
    """Only a loss that returns no tensor is the loss's fault: one that export cannot trace
    (branching on a value) fails the export path as before, and the eager path captures it."""
    from fxviz.errors import CaptureError

    model, x = nn.Sequential(nn.Linear(4, 4)), torch.randn(2, 4)

    def loss(y: torch.Tensor) -> torch.Tensor:
        return y.sum() if float(y.sum()) > 0 else -y.sum()

    with pytest.raises(CaptureError, match="data-dependent"):
        fxviz.capture(model, (x,), backward=True, method="export", loss=loss)
    assert fxviz.capture(model, (x,), backward=True, method="auto", loss=loss).method.startswith("eager")


def test_the_cli_says_a_loss_returns_a_float_on_the_export_path(tmp_path: Any) -> None:
    import textwrap

    from click.testing import CliRunner

    from fxviz.cli import cli

    p = tmp_path / "net.py"
    p.write_text(textwrap.dedent("""
        import torch
        from torch import nn

        def build():
            return nn.Sequential(nn.Linear(4, 4)), (torch.randn(2, 4),)

        def loss(y):
            return float(y.sum())
    """))
    for method in ("export", "eager"):
        res = CliRunner().invoke(cli, ["json", f"{p}:build", "--loss", f"{p}:loss", "-m", method])
        assert res.exit_code != 0 and "Traceback" not in res.output, res.output
        assert "loss returned float, not a tensor: return a scalar tensor" in res.output.strip().splitlines()[-1], res.output


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_t5s_step_saves_on_both_paths_what_torch_packs(train: bool) -> None:
    """T5 (transformers) on the export path: the feed-forward's idle dropout (eval) is a ``clone`` in
    the traced program, so the ``wo`` input counted 1,792 bytes a second time where eager's dropout
    returns its very input; and the encoder's mask, which transformers builds only when traced, was an
    exact record of 7 bytes (8 at sequence 8) that torch never packs. Checked against torch's
    ``saved_tensors_hooks`` of the same step: the eager path exactly; on the export path each exact
    record is a storage torch packs, and what torch packs beyond them is a mask the traced program
    builds otherwise (one per decoder layer in eager, one shared when traced), marked ``inferred``."""
    from tests.backward_models import torch_saved
    from tests.transformers_zoo import t5

    model, args, kwargs = t5()
    model.train(train)
    torch.manual_seed(1)
    packed, _ = torch_saved(model, args, kwargs)
    torch.manual_seed(1)
    eager = fxviz.capture(model, args, kwargs, backward=True, method="eager")
    assert sorted((s.shape, s.dtype, s.bytes) for s in eager.saved if s.bytes) == sorted(packed)
    g = fxviz.capture(model, args, kwargs, backward=True, method="export")
    rest = list(packed)
    for s in g.saved:
        if s.bytes and not s.inferred:
            rest.remove((s.shape, s.dtype, s.bytes))  # ValueError: a record torch never packed
    inferred = Counter((s.shape, s.dtype) for s in g.saved if s.inferred)
    assert rest and Counter((shape, dtype) for shape, dtype, _ in rest) <= inferred
    masks = [s for s in g.saved if s.dtype == "bool"]
    assert len(masks) == 4 and all(s.inferred and "from the shapes alone" in s.reason for s in masks)

