"""What a training capture says, checked against torch's own record of the same step: the real
backward (does it raise?), ``saved_tensors_hooks`` with the module running at each pack (which
module's op saved what), the joint graph's own descriptors. Each test is a discrepancy fxviz had."""

from __future__ import annotations

import contextlib
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


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(16, 32)
        self.l2 = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.l2(torch.tanh(self.l1(x)))


class Checkpointed(nn.Module):
    """Two blocks, each checkpointed (``early_stop`` passed to each call when set); ``ckpt=False``: the
    same step without checkpoint."""

    def __init__(self, early_stop: bool | None = None, ckpt: bool = True) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_Block() for _ in range(2)])
        self.early_stop, self.ckpt = early_stop, ckpt

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        extra = {} if self.early_stop is None else {"early_stop": self.early_stop}
        for b in self.blocks:
            x = checkpoint(b, x, use_reentrant=False, **extra) if self.ckpt else b(x)
        return x


def _recomputed_by_torch(model: nn.Module, x: torch.Tensor) -> Counter[str]:
    """torch's record: the forward ATen ops (addmm, tanh) the real backward runs, early stop as set."""
    from torch.utils._python_dispatch import TorchDispatchMode

    ops: Counter[str] = Counter()

    class _Count(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if str(func.overloadpacket) in ("aten.addmm", "aten.tanh"):
                ops[str(func.overloadpacket)] += 1
            return func(*args, **(kwargs or {}))

    loss = model(x).sum()
    with _Count():
        torch.autograd.grad(loss, list(model.parameters()))
    return ops


def _shown(g: fxviz.Graph) -> Counter[str]:
    return Counter(a for n in g.nodes if n.phase == "recompute" for a in n.attrs["aten"] if a in ("aten.addmm", "aten.tanh"))


def _checkpoint_saved(g: fxviz.Graph) -> dict[str, int]:
    from fxviz.passes.overlays import overlays

    return {k.rsplit("#", 1)[0]: v for k, v in overlays(g)["checkpoint_saved"]["modules"].items() if v}


def test_the_eager_recomputation_is_torchs_own_early_stop_or_not_and_what_checkpoint_saved_is_the_same() -> None:
    """fxviz ran the step with checkpoint's early stop off, so every op of a region was a recompute node
    (with a note saying so) where torch's default step runs l1's addmm and tanh again, not l2's addmm.
    Each step now runs as the user's does: early stop off (globally, as here) shows every op again, as
    torch's step runs it; what checkpointing saved (the forward ops' ``would_save``) is the same both ways
    and is what the step without checkpoint keeps more (``saved_tensors_hooks``)."""
    torch.manual_seed(0)
    model, x = Checkpointed(), torch.randn(4, 16)
    plain = Checkpointed(ckpt=False)
    plain.load_state_dict(model.state_dict())
    assert _recomputed_by_torch(model, x) == {"aten.addmm": 2, "aten.tanh": 2}  # early stop: l2 not again
    g = fxviz.capture(model, (x,), backward=True, method="eager")
    with torch.utils.checkpoint.set_checkpoint_early_stop(False):
        assert _recomputed_by_torch(model, x) == {"aten.addmm": 4, "aten.tanh": 2}
        whole = fxviz.capture(model, (x,), backward=True, method="eager")
    assert _shown(g) == {"aten.addmm": 2, "aten.tanh": 2} and _shown(whole) == {"aten.addmm": 4, "aten.tanh": 2}
    assert [n.attrs.get("stopped") for n in g.nodes if n.phase == "recompute"] == [None, None, True] * 2
    assert not [n for n in whole.nodes if n.attrs.get("stopped")]
    assert not [n for n in [*g.notes, *whole.notes] if "early stop" in n]
    without = sum(torch_saved_by_module(plain, (x,)).values()) - sum(torch_saved_by_module(model, (x,)).values())
    assert _checkpoint_saved(g) == _checkpoint_saved(whole) == {"blocks.0": 512, "blocks.1": 512}
    assert sum(n.attrs.get("would_save", 0) for n in g.nodes) == without == 1024  # each tanh's output


@pytest.mark.parametrize("how", ["default", "off globally", "off per call"])
def test_the_recompute_nodes_are_the_ops_torchs_default_step_runs_again(how: str) -> None:
    """The recompute nodes are what torch's own backward of the same step runs again, however the
    user's step sets early stop (``set_checkpoint_early_stop``, ``checkpoint(..., early_stop=)``)."""
    torch.manual_seed(0)
    model, x = Checkpointed(early_stop=False if how == "off per call" else None), torch.randn(4, 16)
    with torch.utils.checkpoint.set_checkpoint_early_stop(False) if how == "off globally" else contextlib.nullcontext():
        g = fxviz.capture(model, (x,), backward=True, method="eager")
        torchs = _recomputed_by_torch(model, x)
    assert _shown(g) == torchs == ({"aten.addmm": 2, "aten.tanh": 2} if how == "default" else {"aten.addmm": 4, "aten.tanh": 2})


@pytest.mark.parametrize("how", ["default", "off per call"])
def test_the_tree_marks_each_recomputed_op_and_where_torchs_early_stop_ended(how: str) -> None:
    """The terminal tree says which ops the backward ran again (``↻``) and, under torch's default,
    the op whose save ended each recomputation: one per checkpoint call, none with early stop off."""
    from fxviz.render.tree import tree_text

    torch.manual_seed(0)
    model, x = Checkpointed(early_stop=False if how == "off per call" else None), torch.randn(4, 16)
    g = fxviz.capture(model, (x,), backward=True, method="eager")
    text = tree_text(g, width=300, unfold=True)
    recomputed = [n for n in g.nodes if n.phase == "recompute"]
    stopped = [n for n in recomputed if n.attrs.get("stopped")]
    assert len(stopped) == (2 if how == "default" else 0)
    assert text.count("↻") == len(recomputed) > 0, text
    assert text.count("early stop here") == len(stopped), text


class _Nested(nn.Module):
    """A checkpoint around two checkpointed blocks (``ckpt=False``: none)."""

    def __init__(self, ckpt: bool) -> None:
        super().__init__()
        self.a, self.b, self.ckpt = _Block(), _Block(), ckpt

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        def f(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
            return checkpoint(m, x, use_reentrant=False) if self.ckpt else m(x)

        return torch.relu(f(self.b, f(self.a, x)))


class _Outer(nn.Module):
    def __init__(self, ckpt: bool) -> None:
        super().__init__()
        self.inner, self.head, self.ckpt = _Nested(ckpt), nn.Linear(16, 4), ckpt

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        return self.head(checkpoint(self.inner, x, use_reentrant=False) if self.ckpt else self.inner(x))


@pytest.mark.parametrize("early_stop", [True, False])
def test_nested_checkpoints_rerun_as_torchs_step_does_and_what_they_saved_is_counted_once(early_stop: bool) -> None:
    """torch runs an inner checkpoint's ops again twice: in the outer region's recomputation (as a
    forward) and in their own; fxviz showed the second only. And it counted what checkpointing saved
    once per recomputation: 2,560 B where the step without checkpoint keeps 1,280 B more
    (``saved_tensors_hooks``)."""
    from tests.test_backward_recompute import _backward_aten

    torch.manual_seed(0)
    model, plain, x = _Outer(True), _Outer(False), torch.randn(4, 16)
    plain.load_state_dict(model.state_dict())
    with torch.utils.checkpoint.set_checkpoint_early_stop(early_stop):
        g = fxviz.capture(model, (x,), backward=True, method="eager")
        again = Counter(_backward_aten(model, x)) - Counter(_backward_aten(plain, x))
    del again["aten.detach"]
    assert sum((Counter(n.attrs["aten"]) for n in g.nodes if n.phase == "recompute"), Counter()) == again
    assert again["aten.tanh"] == 4  # each block's tanh twice
    twice = [n for n in g.nodes if n.phase == "recompute" and n.name.endswith("(recompute 2)")]
    assert {g.node(n.attrs["recomputes"]).module for n in twice} >= {"inner.a", "inner.b"}
    without = sum(torch_saved_by_module(plain, (x,)).values()) - sum(torch_saved_by_module(model, (x,)).values())
    assert sum(n.attrs.get("would_save", 0) for n in g.nodes) == without == 1280
    assert sum(s.bytes for s in g.saved) == sum(torch_saved_by_module(model, (x,)).values())


class DroppedBranch(nn.Module):
    """A branch computed and dropped (a debug probe, an unused auxiliary head): autograd frees what it
    saved as soon as its result goes."""

    def __init__(self) -> None:
        super().__init__()
        self.probe = nn.Linear(64, 64)
        self.head = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(3):
            torch.tanh(self.probe(x))  # saves its (32, 64) output, dropped at once
        return torch.tanh(self.head(x))


def test_what_a_dropped_branch_saved_is_freed_not_counted_as_the_steps_memory() -> None:
    """The eager path counted every tensor ever packed: 4x the memory autograd holds when the
    backward starts (its own saved-tensor hooks kept the dropped tensors alive in a cycle)."""
    torch.manual_seed(0)
    model, x = DroppedBranch(), torch.randn(32, 64)
    packs: list[int] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packs.append(1) or t, lambda t: t):
        model(x)
    # torch's record of a plain step: the tensors the autograd nodes the output reaches hold
    own = {t.untyped_storage().data_ptr() for t in (x, *model.parameters())}
    out, held, fns = model(x), {}, set()
    todo = [out.grad_fn]
    while todo:
        f = todo.pop()
        if f is None or f in fns:
            continue
        fns.add(f)
        todo += [g for g, _ in f.next_functions]
        for name in dir(f):
            t = getattr(f, name) if name.startswith("_saved_") else None
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in own:
                held[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    assert len(packs) == 8 and sum(held.values()) == 8192  # 8 packs; only the head's tanh output is held
    del out
    g = fxviz.capture(model, (x,), backward=True, method="eager")
    assert sum(s.bytes for s in g.saved) == 8192
    assert [(s.module, s.shares) for s in g.saved if s.node.startswith("tanh")] == [("", "freed")] * 3 + [("", "")]
    assert fxviz.Graph.from_json(g.to_json()).saved == g.saved  # "freed" is a saved graph's word too


_PROBES: list[Any] = []  # weak references to what each run's dropped branch made


class _Probed(DroppedBranch):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import weakref

        _PROBES.append(weakref.ref(torch.tanh(self.probe(x))))
        return torch.tanh(self.head(x))


def test_nothing_a_dropped_branch_saved_outlives_the_capture() -> None:
    """fxviz's saved-tensor hooks held each saved output in a cycle through its own autograd node,
    which the garbage collector cannot break: a capture leaked every tensor a dropped branch saved."""
    import gc

    torch.manual_seed(0)
    model, x = _Probed(), torch.randn(32, 64)
    model(x)
    assert _PROBES.pop()() is None  # torch's own step frees it at once
    fxviz.capture(model, (x,), backward=True, method="eager")
    gc.collect()
    assert len(_PROBES) == 1 and _PROBES.pop()() is None


class _Region(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(16, 32)
        self.l2 = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(torch.tanh(self.l1(x)))


class _CallsCheckpoint(nn.Module):
    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.b = _Region()
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.b, x, use_reentrant=self.reentrant)


class CheckpointCaller(nn.Module):
    """``a`` checkpoints its submodule ``b`` on a value another module (``pre``) made."""

    def __init__(self, reentrant: bool = False) -> None:
        super().__init__()
        self.pre = nn.Linear(16, 16)
        self.a = _CallsCheckpoint(reentrant)
        self.post = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.post(self.a(self.pre(x)))


@pytest.mark.parametrize(("reentrant", "method"), [(False, "eager"), (False, "export"), (True, "eager")])
def test_what_a_checkpoint_saves_to_run_its_region_again_is_saved_in_the_module_that_called_it(
        reentrant: bool, method: str) -> None:
    """checkpoint packs its region's inputs while the module that calls it runs (before the region's
    forward; after it, where reentrant): the eager path gave them to whatever op was recorded last
    (``pre``'s linear, in another module), the export path to the region's first op (``a.b.l1``)."""
    torch.manual_seed(0)
    model, x = CheckpointCaller(reentrant), torch.randn(4, 16)
    expected = torch_saved_by_module(model, (x,))
    assert expected == {"a": 256, "post": 256}  # pre's output, kept by a's checkpoint; post's input
    g = fxviz.capture(model, (x,), backward=True, method=method)
    assert fxviz_saved_by_module(g) == expected
    kept = [s for s in g.saved if s.bytes == 256 and s.module == "a"]
    assert len(kept) == 1 and g.node(kept[0].node).module.startswith("a.b")  # saved by the region's first op
    # the overlay of bytes saved in each module itself says the same: a's, not a.b.l1's (its op's)
    from fxviz.passes.overlays import overlays

    ov = overlays(g)
    assert {k.rsplit("#", 1)[0]: v for k, v in ov["saved_own"]["modules"].items() if v} == expected
    assert ov["saved"]["modules"]["a#0"] == 256 and ov["saved"]["modules"]["a.b#0"] == 0


def test_a_reentrant_checkpoint_steps_as_torchs_backward_does_and_says_what_it_leaves_unseen() -> None:
    """A reentrant checkpoint refuses a backward given its inputs (``torch.autograd.grad``), which
    fxviz ran: the capture said the backward raised "incompatible with .grad()", where the model's
    own ``loss.backward()`` runs. The region's backward runs nested inside its own backward op: the
    gradients made there are named, not dropped silently, and ``.grad`` is left as found."""
    torch.manual_seed(0)
    model, x = CheckpointCaller(reentrant=True), torch.randn(4, 16)
    default_loss(model(x)).backward()  # torch's own step: every parameter gets its gradient
    trained = {name for name, p in model.named_parameters() if p.grad is not None}
    assert len(trained) == 8
    model.zero_grad(set_to_none=True)
    g = fxviz.capture(model, (x,), backward=True, method="eager")
    shown = {o.attrs["grad_of"] for o in g.outputs if "grad_of" in o.attrs}
    assert shown == {"pre.weight", "pre.bias", "post.weight", "post.bias"}
    said = [n for n in g.notes if "reentrant" in n]
    assert len(said) == 1 and f"{len(trained - shown)} parameters (a.b.l1.weight, a.b.l1.bias, a.b.l2.weight ...)" in said[0]
    assert all(p.grad is None for p in model.parameters())


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

