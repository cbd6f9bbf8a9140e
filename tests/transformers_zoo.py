"""Real ``transformers`` architectures built from tiny configs with random weights.

Nothing is downloaded: each factory builds a config by hand (2 layers, hidden 32) and the model from
it under a fixed seed. Each returns ``(model, args, kwargs)`` in eval mode; the decoder LMs keep their
default ``use_cache`` so they return a ``DynamicCache`` (T5 and BART an ``EncoderDecoderCache``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

Built = tuple[nn.Module, tuple[Any, ...], dict[str, Any]]

_VOCAB = 96
_SEQ = 7


def _ids(seq: int = _SEQ, batch: int = 1) -> torch.Tensor:
    return torch.randint(0, _VOCAB, (batch, seq))


def gpt2(n_layer: int = 2) -> Built:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=_VOCAB, n_positions=32, n_embd=32, n_layer=n_layer, n_head=2, bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(cfg).eval(), (_ids(),), {}


def llama() -> Built:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )
    ids = _ids()
    return LlamaForCausalLM(cfg).eval(), (), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def qwen2() -> Built:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )
    return Qwen2ForCausalLM(cfg).eval(), (_ids(),), {}


def bert() -> Built:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=_VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=32,
    )
    ids = _ids(batch=2)
    kwargs = {"attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
    return BertModel(cfg).eval(), (ids,), kwargs


def distilbert() -> Built:
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    torch.manual_seed(0)
    cfg = DistilBertConfig(
        vocab_size=_VOCAB, dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=32,
        num_labels=3,
    )
    return DistilBertForSequenceClassification(cfg).eval(), (_ids(batch=2),), {}


def t5() -> Built:
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    cfg = T5Config(
        vocab_size=_VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
        num_heads=4, decoder_start_token_id=0,
    )
    kwargs = {"input_ids": _ids(), "decoder_input_ids": _ids(seq=4)}
    return T5ForConditionalGeneration(cfg).eval(), (), kwargs


def bart() -> Built:
    from transformers import BartConfig, BartForConditionalGeneration

    torch.manual_seed(0)
    cfg = BartConfig(
        vocab_size=_VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=32,
    )
    kwargs = {"input_ids": _ids(), "decoder_input_ids": _ids(seq=4)}
    return BartForConditionalGeneration(cfg).eval(), (), kwargs


def vit() -> Built:
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    cfg = ViTConfig(
        image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=2, intermediate_size=64, num_labels=5,
    )
    return ViTForImageClassification(cfg).eval(), (torch.randn(1, 3, 16, 16),), {}


def resnet() -> Built:
    from transformers import ResNetConfig, ResNetModel

    torch.manual_seed(0)
    cfg = ResNetConfig(
        num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic",
    )
    return ResNetModel(cfg).eval(), (torch.randn(1, 3, 32, 32),), {}


#: name -> factory; every one is captured by ``method="auto"``.
TRANSFORMERS_ZOO = {
    "gpt2": gpt2,
    "llama": llama,
    "qwen2": qwen2,
    "bert": bert,
    "distilbert": distilbert,
    "t5": t5,
    "bart": bart,
    "vit": vit,
    "resnet": resnet,
}
