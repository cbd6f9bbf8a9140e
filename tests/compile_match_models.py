"""Models whose forward is wholly or partly library code (``torch.nn`` containers and layers,
transformers), where Dynamo keeps no user frame for an op and the eager tracer finds the line that
called the model: the compile map must still match them (issue 18, "what fxviz already shows must be
true")."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def _x(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))


def torch_sequential() -> tuple[nn.Module, tuple[Any, ...]]:
    """Only ``torch.nn`` containers and layers: one graph, no break."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4)).eval(), (_x(4, 8),)


def encoder(training: bool = False) -> tuple[nn.Module, tuple[Any, ...]]:
    """``nn.TransformerEncoder`` of two layers at the top. In eval mode without grad, torch.compile
    runs each layer as one ``_transformer_encoder_layer_fwd`` while the tracer (a torch function
    mode is on) sees its Python path; in training both see the Python path, which Dynamo inlines."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    return model.train(training), (_x(2, 5, 16),)


def encoder_training() -> tuple[nn.Module, tuple[Any, ...]]:
    return encoder(training=True)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x))


class ItemBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.lin(x)
        s = x.abs().mean().item()
        return x / (1 + s)


def sequential_with_break() -> tuple[nn.Module, tuple[Any, ...]]:
    """A top-level ``nn.Sequential`` of user modules and ``torch.nn`` layers with a break in the
    middle: Dynamo cannot resume inside ``Sequential.forward``'s loop, so it runs eagerly, the user
    modules compile as frames of their own (``Block``'s graph runs again for ``4``), and the
    ``torch.nn`` layers it calls directly run eagerly."""
    torch.manual_seed(0)
    model = nn.Sequential(Block(), nn.Linear(8, 8), ItemBlock(), nn.ReLU(), Block(), nn.Linear(8, 4))
    return model.eval(), (_x(4, 8),)


def bert_in_sequential() -> tuple[nn.Module, tuple[Any, ...]]:
    """A transformers ``BertLayer`` (its forward all library code) between two layers of a user's
    ``nn.Sequential``: one graph, no break."""
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertLayer

    torch.manual_seed(0)
    config = BertConfig(hidden_size=16, num_attention_heads=2, intermediate_size=32, num_hidden_layers=1)
    config._attn_implementation = "eager"
    return nn.Sequential(nn.Linear(16, 16), BertLayer(config), nn.Linear(16, 4)).eval(), (_x(2, 5, 16),)


class Nested(nn.Module):
    """A user module calling a ``torch.nn.Sequential`` with a break inside one of its children:
    the Sequential runs eagerly, its user child compiles on its own, the head after it resumes."""

    def __init__(self) -> None:
        super().__init__()
        self.seq = nn.Sequential(nn.Linear(8, 8), ItemBlock(), nn.Linear(8, 8))
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.seq(x)
        return self.head(x).tanh()


def nested_sequential_with_break() -> tuple[nn.Module, tuple[Any, ...]]:
    torch.manual_seed(0)
    return Nested().eval(), (_x(4, 8),)
