"""A transformers model's training step on the eager path, checked per module against torch's own
record of the same step (``saved_tensors_hooks`` with the module running at each pack)."""

from __future__ import annotations

import pytest

import fxviz
from tests.test_backward_truth import fxviz_saved_by_module, torch_saved_by_module


@pytest.mark.parametrize("name", ["t5", "bert"])
def test_a_transformers_eager_step_saves_per_module_what_torch_packs(name: str) -> None:
    """T5 (encoder-decoder, relative position bias, a cache output) and BERT (attention mask, token
    types), eager path: each module's saved bytes are those ``saved_tensors_hooks`` packs while it
    runs in a real step of the same loss, each storage once."""
    from tests import transformers_zoo

    model, args, kwargs = getattr(transformers_zoo, name)()
    expected = torch_saved_by_module(model, args, kwargs)
    model.zero_grad(set_to_none=True)
    g = fxviz.capture(model, args, kwargs, backward=True, method="eager")
    assert fxviz_saved_by_module(g) == expected
    assert sum(expected.values()) > 0 and len(expected) > 4
