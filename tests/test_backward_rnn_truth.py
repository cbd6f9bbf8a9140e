"""A recurrent model's training step, checked against torch's own record of the same step
(``saved_tensors_hooks`` per module, the autograd nodes): export decomposes ``aten.lstm`` into cell
ops, where eager on CPU runs MKLDNN's fused LSTM, whose backward keeps a workspace of its own."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fxviz
from fxviz.errors import CaptureError
from tests.backward_models import autograd_nodes, default_loss
from tests.test_backward_truth import fxviz_saved_by_module, torch_saved_by_module


class Tagger(nn.Module):
    def __init__(self, rnn: type[nn.Module]) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.rnn = rnn(8, 16, num_layers=2, batch_first=True)
        self.fc = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        o, _ = self.rnn(self.emb(x))
        return self.fc(o[:, -1])


def test_an_lstm_steps_saved_activations_are_the_fused_kernels() -> None:
    """The default path gave the joint graph's 133 records, 10,560 bytes, for an LSTM whose real step
    saves 59,968 (MKLDNN's LSTM, 2 ``MkldnnRnnLayerBackward0`` nodes), without a word. Now export
    refuses it in one line and the eager path records the step as torch does."""
    if not (torch.backends.mkldnn.is_available() and torch._C._get_mkldnn_enabled()):
        pytest.skip("no MKLDNN: eager decomposes the LSTM as export does")
    torch.manual_seed(0)
    model, x = Tagger(nn.LSTM), torch.randint(0, 20, (2, 5))
    expected = torch_saved_by_module(model, (x,))
    fused = [f for f in autograd_nodes(default_loss(model(x))) if type(f).__name__ == "MkldnnRnnLayerBackward0"]
    assert len(fused) == 2
    model.zero_grad(set_to_none=True)
    g = fxviz.capture(model, (x,), backward=True)
    assert [a.method for a in g.attempts] == ["export", "eager"]
    assert fxviz_saved_by_module(g) == expected and sum(expected.values()) == 59_968
    assert sum(n.target == "MkldnnRnnLayerBackward0" for n in g.nodes) == 2
    with pytest.raises(CaptureError) as info:
        fxviz.capture(model, (x,), backward=True, method="export")
    assert "export decomposes nn.LSTM (aten.lstm.input) into per-step cell ops" in info.value.attempts[0].message


@pytest.mark.parametrize("rnn", [nn.GRU, nn.RNN])
def test_a_gru_or_rnn_step_is_the_eager_cells_not_the_decomposition(rnn: type[nn.Module]) -> None:
    """Eager's GRU on CPU runs ATen's C++ cells, which save 7,680 bytes per layer where the joint
    graph of torch's decomposition saved 8,960 (the default path said 11,200 for the model, torch
    packs 9,920); refused on the export path like the LSTM, recorded by the eager path as torch packs."""
    torch.manual_seed(0)
    model, x = Tagger(rnn), torch.randint(0, 20, (2, 5))
    expected = torch_saved_by_module(model, (x,))
    model.zero_grad(set_to_none=True)
    g = fxviz.capture(model, (x,), backward=True)
    assert [a.method for a in g.attempts] == ["export", "eager"]
    assert fxviz_saved_by_module(g) == expected
