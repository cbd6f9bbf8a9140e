"""Recomputation on the eager path: the ops ``torch.utils.checkpoint`` runs again in the backward are
nodes of phase ``recompute`` in the module of the forward op they repeat, and the bytes checkpointing
saved per module. Oracles: torch's own records of the same model with and without checkpoint
(``saved_tensors_hooks`` totals, the ATen ops a TorchDispatchMode sees run during the backward)."""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint

import fxviz
from fxviz.passes.overlays import overlays
from tests.backward_models import torch_step
from tests.statecheck import kept


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(8, 32)
        self.act = nn.GELU()
        self.down = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


class Net(nn.Module):
    def __init__(self, ckpt: bool) -> None:
        super().__init__()
        self.ckpt = ckpt
        self.blk = Inner()
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = checkpoint(self.blk, x, use_reentrant=False) if self.ckpt else self.blk(x)
        return self.head(torch.tanh(h))


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def _backward_aten(model: nn.Module, x: torch.Tensor) -> list[str]:
    loss = model(x).sum()
    with _Count() as c:
        torch.autograd.grad(loss, list(model.parameters()))
    return c.ops


def test_checkpointed_ops_are_recompute_nodes_in_their_module_with_the_bytes_saved() -> None:
    torch.manual_seed(0)
    model, x = Net(True), torch.randn(4, 8)
    plain = Net(False)
    plain.load_state_dict(model.state_dict())
    with kept(model, (x,)):
        g = fxviz.capture(model, (x,), backward=True, method="eager")
    again = Counter(_backward_aten(model, x)) - Counter(_backward_aten(plain, x))  # early stop, as the capture's step
    re = [n for n in g.nodes if n.phase == "recompute"]
    by_name = {n.name: n for n in g.nodes}
    # each repeats a forward op of the checkpointed block, in its module, with the same target
    assert [(n.target, n.module) for n in re] == [("torch.nn.functional.linear", "blk.up"),
                                                 ("torch.nn.functional.gelu", "blk.act"),
                                                 ("torch.nn.functional.linear", "blk.down")]
    for n in re:
        fwd = by_name[n.attrs["recomputes"]]
        assert fwd.phase == "forward" and fwd.target == n.target and fwd.stack == n.stack
    assert re[1].inputs[0].node == re[0].name  # reads the recomputed value, not the forward's
    # torch's record of the ATen ops the backward runs again (beside checkpoint's own detaches): up's
    # addmm, the gelu, down's weight.t(); early stop ends it in down's addmm's save of its input, before
    # that addmm runs: each recompute node says what of it ran, down's that it stopped there
    del again["aten.detach"]
    assert again == Counter({"aten.t": 2, "aten.addmm": 1, "aten.gelu": 1})
    assert sum((Counter(n.attrs["aten"]) for n in re), Counter()) == again
    assert [n.attrs.get("stopped") for n in re] == [None, None, True]
    # recompute nodes come before the backward ops that read them
    order = [n.name for n in g.nodes]
    for n in g.nodes:
        for r in n.inputs:
            assert order.index(r.node) < order.index(n.name)
    # bytes: with checkpoint the saved records are torch's; checkpointing saved what plain saves more
    with_ckpt, without = torch_step(model, (x,))[0], torch_step(plain, (x,))[0]
    assert sum(s.bytes for s in g.saved) == with_ckpt
    assert without - with_ckpt == 1024 == sum(by_name[n.attrs["recomputes"]].attrs["would_save"] for n in re)
    ov = overlays(g)["checkpoint_saved"]
    assert ov["modules"]["blk#0"] == 1024 and ov["modules"]["blk.act#0"] == 512 and ov["modules"]["blk.down#0"] == 512
    # the JSON keeps it: a saved graph reads back with the same recompute nodes and overlay
    back = fxviz.Graph.from_json(g.to_json())
    assert [(n.name, n.phase, n.attrs) for n in back.nodes if n.phase == "recompute"] == \
        [(n.name, n.phase, n.attrs) for n in re]
    assert overlays(back)["checkpoint_saved"] == overlays(g)["checkpoint_saved"]


def test_no_checkpoint_no_recompute() -> None:
    torch.manual_seed(0)
    g = fxviz.capture(Net(False), (torch.randn(4, 8),), backward=True, method="eager")
    assert not [n for n in g.nodes if n.phase == "recompute"]
    assert not overlays(g).get("checkpoint_saved", {}).get("modules")


def _policy(_ctx: Any, op: Any, *_a: Any, **_k: Any) -> Any:
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if op == torch.ops.aten.addmm.default else CheckpointPolicy.PREFER_RECOMPUTE


class Selective(Net):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import create_selective_checkpoint_contexts

        ctx = functools.partial(create_selective_checkpoint_contexts, _policy)
        return self.head(torch.tanh(checkpoint(self.blk, x, use_reentrant=False, context_fn=ctx)))


def test_a_selective_policy_keeps_the_ops_it_saves_out_of_the_recomputation() -> None:
    torch.manual_seed(0)
    model, x = Selective(True), torch.randn(4, 8)
    plain = Net(False)
    plain.load_state_dict(model.state_dict())
    with kept(model, (x,)):
        g = fxviz.capture(model, (x,), backward=True, method="eager")
    re = [n for n in g.nodes if n.phase == "recompute"]
    again = Counter(_backward_aten(model, x)) - Counter(_backward_aten(plain, x))
    del again["aten.detach"]
    # what ran again is what torch ran again: no addmm (the policy saved both), the gelu
    assert sum((Counter(n.attrs["aten"]) for n in re), Counter()) == again == Counter({"aten.t": 2, "aten.gelu": 1})
    # early stop: the recomputation ends in linear_1's save of its input, before it asks for its addmm
    assert {n.attrs["recomputes"]: (n.attrs.get("policy_saved"), n.attrs.get("stopped")) for n in re} == {
        "linear": (["aten.addmm"], None), "gelu": (None, None), "linear_1": (None, True)}
    # the bytes: what autograd saves and what the policy told torch to cache (its own calls, in a real step)
    assert sum(s.bytes for s in g.saved) == torch_step(model, (x,))[0] + policy_cache_bytes(model, x) == 128 + 640
    assert {n.name: n.attrs["would_save"] for n in g.nodes if "would_save" in n.attrs} == {
        "linear": 0, "gelu": 0, "linear_1": 512}


class _Cached:
    """:func:`_policy`, noting the bytes of what it tells torch to cache."""

    def __init__(self) -> None:
        self.bytes = 0

    def __call__(self, ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        from torch.utils.checkpoint import CheckpointPolicy

        policy = _policy(ctx, op, *args, **kwargs)
        if policy == CheckpointPolicy.MUST_SAVE and not ctx.is_recompute:
            self.bytes += ctx.op_output.untyped_storage().nbytes()
        return policy


class _Recording(Net):
    def __init__(self, policy: _Cached) -> None:
        super().__init__(True)
        self.policy = policy

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import create_selective_checkpoint_contexts

        ctx = functools.partial(create_selective_checkpoint_contexts, self.policy)
        return self.head(torch.tanh(checkpoint(self.blk, x, use_reentrant=False, context_fn=ctx)))


def policy_cache_bytes(model: nn.Module, x: torch.Tensor) -> int:
    """torch's record of what :class:`Selective`'s policy caches in a step: the outputs its calls
    in the forward tell torch to keep."""
    recording = _Recording(_Cached())
    recording.load_state_dict(model.state_dict())
    recording(x).sum()
    return recording.policy.bytes


class _Twice(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * 2  # Python code run by the backward, as a forward op of the same module is


class _UsesTwice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Twice.apply(self.lin(x)) * 3


def test_a_custom_functions_backward_code_is_not_recompute() -> None:
    torch.manual_seed(0)
    g = fxviz.capture(_UsesTwice(), (torch.randn(3, 4),), backward=True, method="eager")
    assert [n.target for n in g.ops if n.phase == "backward"][-4:-2] == ["MulBackward0", "_TwiceBackward"]
    assert not [n for n in g.nodes if n.phase == "recompute"]
