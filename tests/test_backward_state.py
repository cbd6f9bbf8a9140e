"""``capture(backward=True)`` leaves the model, its ``.grad``, the inputs and the process as it found
them, whatever the forward does (the state harness, ``tests/statecheck.py``, over every scenario of
``tests/state_models.py``, each path forced and ``auto``)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import fxviz
from fxviz.errors import CaptureError, ModelError
from fxviz.torchbridge.training import LossError
from tests.state_models import SCENARIOS
from tests.statecheck import kept


def _capture(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], method: str) -> fxviz.Graph | None:
    try:
        return fxviz.capture(model, args, kwargs, method=method, backward=True)
    except (CaptureError, ModelError, LossError):
        return None


@pytest.mark.parametrize("method", ["export", "eager", "auto"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_a_training_capture_leaves_everything_as_found(scenario: str, method: str) -> None:
    model, args, kwargs = SCENARIOS[scenario]()
    for p in list(model.parameters())[:1]:  # an existing gradient: kept, never accumulated into
        p.grad = torch.full_like(p, 0.5)
    with kept(model, args, kwargs):
        _capture(model, args, kwargs, method)
