"""Recurrent layers (``aten.lstm``, ``aten.gru``, ``aten.rnn_tanh``, ``aten.rnn_relu``), which export
decomposes with torch's Python decomposition: the joint graph of such a step differentiates that
decomposition, not what eager runs (one fused kernel with a workspace of its own: MKLDNN's LSTM on
CPU, cuDNN's on CUDA; else ATen's C++ cells, which save other tensors: a 2-layer GRU of hidden 16
over 5 steps on CPU keeps 7,680 bytes of cell values where the decomposition's graph keeps 8,960).
:func:`fxviz.symbolic.joint.export_joint` refuses them, so that the eager path records the real step."""

from __future__ import annotations

import torch.fx

_RNN_MODES = {"lstm": "LSTM", "gru": "GRU", "rnn_tanh": "RNN", "rnn_relu": "RNN"}


def rnn_layers(graph: torch.fx.Graph) -> list[str]:
    """The recurrent layers ``graph`` calls, as ``nn.LSTM (aten.lstm.input)``, each once."""
    found: dict[str, None] = {}
    for n in graph.nodes:
        mode = getattr(n.target, "__name__", "").split(".")[0] if n.op == "call_function" else ""
        if mode in _RNN_MODES:
            found[f"nn.{_RNN_MODES[mode]} ({n.target})"] = None
    return list(found)


__all__ = ["rnn_layers"]
