"""The transformers models the report's browser tests and its benchmark open at full size, built
from configs on ``meta`` (no weights): GPT-2 small, T5-small, the 80-layer LLaMA-70B shape."""

from __future__ import annotations

import pytest
import torch

import fxviz


def gpt2_small_graph(layers: int = 12) -> fxviz.Graph:
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=layers)).eval()
    return fxviz.capture(model, (torch.zeros(1, 16, dtype=torch.long, device="meta"),), method="export")


def t5_small_graph() -> fxviz.Graph:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.T5Config(d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_decoder_layers=6, num_heads=8,
                                vocab_size=32128, decoder_start_token_id=0)
    with torch.device("meta"):
        model = transformers.T5ForConditionalGeneration(cfg).eval()
    kwargs = {"input_ids": torch.zeros(1, 16, dtype=torch.long, device="meta"),
              "decoder_input_ids": torch.zeros(1, 4, dtype=torch.long, device="meta")}
    return fxviz.capture(model, (), kwargs, method="export")


def llama_80_graph() -> fxviz.Graph:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=8192, intermediate_size=28672, num_attention_heads=64,
                                   num_key_value_heads=8, num_hidden_layers=80, vocab_size=32000)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg).eval()
    return fxviz.capture(model, (torch.zeros(1, 16, dtype=torch.long, device="meta"),), method="export")
