"""A capture leaves the model, the user's inputs and the process as it found them, whatever the
forward does and whichever method runs (``tests/statecheck.py`` is the harness, ``tests/state_models.py``
the scenarios): each method forced, and ``auto``."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import fxviz
from fxviz.errors import CaptureError, ModelError
from fxviz.fallback import trace_eager
from tests.fallback_models import ZOO
from tests.state_models import SCENARIOS
from tests.statecheck import kept

METHODS = ("export", "export-strict", "export-decomposed", "fx", "eager", "eager-aten", "auto")


def _capture(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], method: str) -> fxviz.Graph | None:
    """Capture, or None when the method cannot (a method may fail on a scenario: it must still leave
    everything as it found it, and fail as fxviz fails, never with another exception)."""
    try:
        return fxviz.capture(model, args, kwargs, method=method)
    except (CaptureError, ModelError):
        return None


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_capture_leaves_everything_as_found(scenario: str, method: str) -> None:
    model, args, kwargs = SCENARIOS[scenario]()
    with kept(model, args, kwargs):
        _capture(model, args, kwargs, method)


# ---- the cases behind the harness, one by one ------------------------------------------------------


class _CountsItsCalls(nn.Module):
    """Writes a buffer, logs what it saw, then branches on the data: export and fx fail after the
    write, and ``auto`` ends with the eager tracer."""

    def __init__(self, log: list[int]) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self._log = log.append  # a bound method: the guard does not walk into it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.steps.add_(1)
        if not isinstance(self.steps, torch.fx.Proxy) and type(self.steps) is torch.Tensor:
            self._log(int(self.steps))
        y = self.lin(x)
        return y.relu() if y.sum() > 0 else y.tanh()


def test_every_attempt_starts_from_the_model_as_found() -> None:
    """fx writes the buffer for real before it fails; the eager attempt after it must see the
    original (each attempt is restored from one snapshot taken before the first)."""
    log: list[int] = []
    model = _CountsItsCalls(log).eval()
    x = torch.randn(3, 4)
    with kept(model, (x,)):
        g = fxviz.capture(model, (x,))
    assert g.method == "eager" and [a.method for a in g.attempts][-2:] == ["fx", "eager"]
    assert log and set(log) == {1}, log  # every run that saw a real buffer saw it at 0 + 1
    assert int(model.steps) == 0


def test_an_eager_trace_of_cond_does_not_break_a_later_export() -> None:
    """``torch.cond`` compiles its branches through Dynamo even in eager mode; under the ATen-level
    tracer Dynamo marked code objects to skip, and a later non-strict export of a ``cond`` model
    failed ("Scope.__init__ marked as skipped"). The tracer now resets the code Dynamo saw."""
    model, args, kwargs = ZOO["cond"].build()
    for level in ("aten", "function", "aten"):
        # the tracer cannot follow cond (test_fallback's tracer_limit names torch's errors; after
        # an ATen-level try, Dynamo fails differently at function level: it traces into the
        # tracer's own process-wide table of classified callables, which that try filled)
        with pytest.raises(Exception):  # noqa: B017
            trace_eager(model, args, kwargs, level=level)
        g = fxviz.capture(model, args, kwargs, method="export")
        assert any("cond" in n.target for n in g.ops)


def test_a_users_compiled_code_keeps_its_cache() -> None:
    """Only the code Dynamo first saw during a capture is reset: a function the user compiled
    before keeps its compiled entries (no recompilation afterwards). Non-strict export of a
    ``cond`` model compiles through Dynamo. (Strict export is another matter: torch itself calls
    ``torch._dynamo.reset()`` in it, which drops every compiled function's cache.)"""
    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list

    def f(x: torch.Tensor) -> torch.Tensor:
        return x.sin() + 1

    compiled = torch.compile(f, backend="eager")
    x = torch.randn(4)
    compiled(x)
    entries = len(_debug_get_cache_entry_list(f.__code__))
    assert entries == 1
    model, args, kwargs = ZOO["cond"].build()
    with kept(model, args, kwargs):
        fxviz.capture(model, args, kwargs, method="export")
    assert len(_debug_get_cache_entry_list(f.__code__)) == entries
    torch.testing.assert_close(compiled(x), f(x))


@pytest.mark.parametrize("method", ["eager", "export"])
def test_the_models_own_warning_reaches_the_callers_record(method: str) -> None:
    """A warning the model makes goes through the warning machinery the caller set up: a
    ``catch_warnings(record=True)`` around the capture records it (it was printed to stderr)."""
    import warnings

    from tests.state_models import Chatty

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fxviz.capture(Chatty().eval(), (torch.randn(2, 4),), method=method)
    assert "chatty: a warning of the model's own" in [str(w.message) for w in caught]


def test_fx_refuses_a_parameter_write_it_would_run_for_real_and_leave_out_of_its_graph() -> None:
    """torch's record: one plain forward of MomentumLoop moves k's parameters; fx traced the loop
    on real parameters, so the graph held none of those writes (and the model kept them)."""
    model, args, _ = SCENARIOS["momentum_loop"]()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CaptureError, match=r"fx: TraceError: the forward writes k\.weight, k\.bias in place"):
        fxviz.capture(model, args, method="fx")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    g = fxviz.capture(model, args, method="eager")  # the eager graph records the writes: mul_, add_ per parameter
    assert sum(n.target.endswith(("mul_", "add_")) for n in g.ops) == 4
    with torch.no_grad():
        model(*args)
    assert not torch.equal(before["k.weight"], model.k.weight)  # what the forward itself does
