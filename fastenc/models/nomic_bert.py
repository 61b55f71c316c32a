"""NomicBERT encoder (nomic-embed-text, transformers' NomicBertModel) on packed tokens: GTE's blocks
(fastenc.models.gte: word + token-type embeddings and LayerNorm, post-LayerNorm blocks, RoPE on q and k, a gated MLP
act(gate) * up fused into one [gate | up] Wi) without any bias in the attention projections or the MLP, SwiGLU by
default (hidden_act "silu", through fastenc.ops.swiglu), RoPE theta 1000 by default, and BERT's masked-LM head
(LayerNorm(hidden_act(dense(x))) then the tied decoder and cls.predictions.bias).

Usage and heads as fastenc.models.gte: NomicBertModel, NomicBertForSequenceClassification (tanh pooler on the first
token, classifier), NomicBertForTokenClassification, NomicBertForMaskedLM. encode() mean-pools by default
(nomic-embed-text's sentence-transformers setting).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from fastenc.models import gte
from fastenc.models.architecture import Architecture, heads_of
from fastenc.models.bert import pooler_override
from fastenc.models.convert import Entry


@dataclass
class NomicBertConfig(gte.GteConfig):
    """NomicBERT (config names as transformers' NomicBertConfig)."""
    vocab_size: int = 30528
    hidden_act: str = "silu"
    max_position_embeddings: int = 2048
    type_vocab_size: int = 2
    pad_token_id: int | None = 0
    hidden_dropout_prob: float = 0.0
    rope_theta: float = 1000.0
    model_type: str = "nomic_bert"

    DEFAULT_THETA = 1000.0


class NomicBertLayer(gte.GteLayer):
    """GteLayer without biases in the attention and MLP projections, no dropout inside the MLP."""

    def __init__(self, cfg: NomicBertConfig):
        super().__init__(cfg, bias=False, mlp_dropout=False)


class NomicBertModel(gte.GteModel):
    layer_class = NomicBertLayer


class NomicBertForSequenceClassification(gte.GteForSequenceClassification):
    layer_class = NomicBertLayer


class NomicBertForTokenClassification(gte.GteForTokenClassification):
    layer_class = NomicBertLayer


class NomicBertForMaskedLM(gte.GteForMaskedLM):
    layer_class = NomicBertLayer

    @staticmethod
    def lm_act(config) -> str:
        """BERT's prediction head transform: hidden_act."""
        return config.hidden_act


# The checkpoint layout transformers' save_pretrained writes for NomicBERT (nomic-embed-text's): emb_ln,
# encoder.layers.N, attn.Wqkv ([q; k; v]), attn.out_proj, mlp.fc11 (up), mlp.fc12 (gate), mlp.fc2, norm1, norm2.
LEGACY_NAMES = (
    (re.compile(r"(^|\.)emb_ln\."), r"\1embeddings.LayerNorm."),
    (re.compile(r"(^|\.)encoder\.layers\.(\d+)\."), r"\1layers.\2."),
    (re.compile(r"\.attn\.out_proj\."), ".self_attn.o_proj."),
    (re.compile(r"\.mlp\.fc11\."), ".mlp.up_proj."),
    (re.compile(r"\.mlp\.fc12\."), ".mlp.gate_proj."),
    (re.compile(r"(layers\.\d+)\.mlp\.fc2\."), r"\1.mlp.down_proj."),
    (re.compile(r"(layers\.\d+)\.norm1\."), r"\1.post_attention_layernorm."),
    (re.compile(r"(layers\.\d+)\.norm2\."), r"\1.post_mlp_layernorm."),
)
LEGACY_FUSED = (
    (r"(.*layers\.\d+)\.attn\.Wqkv\.(weight|bias)", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
)

_MLM = ("cls.predictions.transform.dense", "cls.predictions.transform.layer_norm", "cls.predictions.bias")


def weight_map(cfg: NomicBertConfig, task: str, prefix: str = "") -> list[Entry]:
    """fastenc name <-> transformers name of every NomicBERT tensor (prefix: "nomic_bert." inside the head classes):
    GTE's map without the projections' biases, BERT's masked-LM head names."""
    return gte.weight_map(cfg, task, prefix, bias=False, mlm=_MLM)


def tiny_config(task: str = "base", hidden: int = 64, heads: int = 4, layers: int = 2, **kw):
    """A small transformers NomicBertConfig for tests (Architecture.tiny_config; eager attention as the reference)."""
    import transformers

    kw.setdefault("max_position_embeddings", 4096)
    return transformers.NomicBertConfig(vocab_size=211, hidden_size=hidden, num_hidden_layers=layers,
                                        num_attention_heads=heads, intermediate_size=hidden + 24, pad_token_id=0,
                                        type_vocab_size=2, num_labels=5, attn_implementation="eager", **kw)


ARCHITECTURE = Architecture(
    model_type="nomic_bert",
    config=NomicBertConfig,
    heads=heads_of(NomicBertModel, NomicBertForSequenceClassification, NomicBertForTokenClassification,
                   NomicBertForMaskedLM),
    weight_map=weight_map,
    head_prefix="nomic_bert.",
    legacy_names=LEGACY_NAMES,
    legacy_fused=LEGACY_FUSED,
    config_overrides=pooler_override,
    hf_config=gte.hf_config,
    lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"),
    pooling="mean",
    base_output="BaseModelOutputWithPooling",
    tiny_config=tiny_config,
)
