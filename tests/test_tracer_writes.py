"""The eager tracer treats a call as a writer only when that call writes (issue 18, point 9): a
model tensor is copied before a call that may write it and put back afterwards, and never copied
for a call that cannot write (``F.embedding`` without ``max_norm``, ``F.relu(inplace=False)``):
copying GPT-2's 154 MB token embedding on every capture cost more than the rest of the tracer."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fxviz.fallback import trace_eager
from fxviz.fallback.classify import kind_of
from fxviz.fallback.tensors import ModelTensors


class Lookup(nn.Module):
    """An embedding (optionally renormalising its rows, which writes the weight) and a ReLU on a
    view of a parameter (in place or not)."""

    def __init__(self, max_norm: float | None, inplace: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(10, 4, max_norm=max_norm)
        with torch.no_grad():
            self.emb.weight.mul_(5)  # rows of norm well above 1: max_norm=1.0 rewrites them
            self.emb.weight[0] = -1.0  # a row the ReLU below changes
        self.inplace = inplace

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        y = self.emb(ids)
        # a view of the weight: the writer is found through its storage, not by identity
        r = F.relu(self.emb.weight.view(-1), inplace=self.inplace)
        return y.sum() + r.sum()


def _copied_names(model: nn.Module, monkeypatch: pytest.MonkeyPatch, ids: torch.Tensor) -> list[str]:
    """Trace ``model`` and name the model tensors the tracer copied to put back afterwards."""
    copied: list[torch.Tensor] = []
    original = ModelTensors._backup

    def spy(self: ModelTensors, t: torch.Tensor) -> None:
        if id(t) not in self._backed:  # copied now (a tensor is copied once per capture)
            copied.append(t)
        original(self, t)

    with monkeypatch.context() as m:
        m.setattr(ModelTensors, "_backup", spy)
        trace_eager(model, (ids,))
    names = {id(t): n for n, t in model.state_dict(keep_vars=True).items()}
    return [names.get(id(t), "?") for t in copied]


IDS = torch.tensor([[0, 3, 3, 7]])


def test_embedding_without_max_norm_and_relu_not_in_place_copy_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    model = Lookup(max_norm=None, inplace=False).eval()
    before = model.emb.weight.detach().clone()
    assert _copied_names(model, monkeypatch, IDS) == []
    assert torch.equal(model.emb.weight, before)


def test_embedding_with_max_norm_and_relu_in_place_are_put_back(monkeypatch: pytest.MonkeyPatch) -> None:
    for max_norm, inplace in ((1.0, False), (None, True), (1.0, True)):
        model = Lookup(max_norm=max_norm, inplace=inplace).eval()
        before = model.emb.weight.detach().clone()
        version = model.emb.weight._version
        # the forward itself writes the weight (else this test would prove nothing)
        with torch.no_grad():
            probe = Lookup(max_norm=max_norm, inplace=inplace).eval()
            probe(IDS)
        assert not torch.equal(probe.emb.weight, before)
        assert _copied_names(model, monkeypatch, IDS) == ["emb.weight"], (max_norm, inplace)
        assert torch.equal(model.emb.weight, before), (max_norm, inplace)
        assert model.emb.weight._version >= version


@pytest.mark.parametrize(("func", "args", "kwargs", "writes"), [
    (F.embedding, (IDS, torch.zeros(10, 4)), {}, False),
    (F.embedding, (IDS, torch.zeros(10, 4)), {"max_norm": None}, False),
    (F.embedding, (IDS, torch.zeros(10, 4)), {"max_norm": 1.0}, True),
    (F.embedding, (IDS, torch.zeros(10, 4), None, 1.0), {}, True),  # max_norm given by position
    (F.relu, (torch.zeros(3),), {}, False),
    (F.relu, (torch.zeros(3),), {"inplace": False}, False),
    (F.relu, (torch.zeros(3),), {"inplace": True}, True),
    (F.relu, (torch.zeros(3), True), {}, True),
    (F.dropout, (torch.zeros(3), 0.5, False, True), {}, True),
    (F.batch_norm, (torch.zeros(2, 3), torch.zeros(3), torch.ones(3)), {"training": False}, False),
    (F.batch_norm, (torch.zeros(2, 3), torch.zeros(3), torch.ones(3)), {"training": True}, True),
    (F.batch_norm, (torch.zeros(2, 3), None, None), {"training": True}, False),
    (F.instance_norm, (torch.zeros(1, 3, 4), torch.zeros(3), torch.ones(3)), {}, True),
    (F.instance_norm, (torch.zeros(1, 3, 4),), {}, False),
])
def test_a_call_writes_only_for_the_arguments_that_make_it_write(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], writes: bool
) -> None:
    kind = kind_of(func, "function")
    assert not kind.writes and kind.writes_when is not None
    assert kind.writes_when(args, kwargs) is writes
    if func in (F.embedding, F.relu):
        # what torch itself does with these arguments: the write bumps the version counter of the
        # tensor written (BatchNorm's kernels update running statistics without bumping it)
        target = args[1] if func is F.embedding else args[0]
        if writes and func is F.embedding:
            target.fill_(2.0)  # rows of norm 4 > max_norm: renormalised
        v = target._version
        func(*args, **kwargs)
        assert (target._version != v) is writes


@pytest.mark.parametrize("func", [torch.Tensor.add_, torch.Tensor.__setitem__, torch.Tensor.__iadd__,
                                  torch.Tensor.backward, torch.batch_norm])
def test_in_place_operators_and_builtins_without_a_signature_always_write(func: Any) -> None:
    assert kind_of(func, "function").writes


@pytest.mark.parametrize("func", [torch.embedding, torch.relu, F.linear, torch.Tensor.relu])
def test_calls_that_never_write_are_not_writers(func: Any) -> None:
    kind = kind_of(func, "function")
    assert not kind.writes and kind.writes_when is None
