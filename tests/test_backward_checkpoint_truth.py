"""Activation checkpointing in a training capture, checked against torch's own record of the same
step: which ops torch's backward runs again (and where its early stop ends them), what checkpoint
saves to run a region again, what a dropped branch saved (``saved_tensors_hooks`` with the module
running at each pack). Split from ``test_backward_truth`` (the same oracles)."""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Any

import pytest
import torch
from torch import nn

import fxviz
from tests.backward_models import autograd_nodes, default_loss
from tests.test_backward_truth import fxviz_saved_by_module, torch_saved_by_module


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
    out, held = model(x), {}
    for f in autograd_nodes(out):
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
