"""Config dataclasses for the three encoder families, read from a Hugging Face config.json dict
(transformers 5.x names: BertConfig, ModernBertConfig with layer_types/rope_parameters, ViTConfig)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

def _pick(cls, d: Mapping[str, Any], **override) -> dict:
    names = {f.name for f in dataclasses.fields(cls)}
    out = {k: v for k, v in d.items() if k in names and v is not None}
    out.update(override)
    return out


def _num_labels(d: Mapping[str, Any]) -> int:
    if d.get("id2label") is not None:  # ({} is num_labels=0, as transformers writes it)
        return len(d["id2label"])
    return int(d.get("num_labels", 2))


@dataclass
class _Common:
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    num_labels: int = 2
    id2label: dict | None = None
    problem_type: str | None = None  # sequence/image classification loss; inferred from the labels when None
    # The Hugging Face config dict this config was read from (kept for save_pretrained); None when built directly.
    hf_config: dict | None = field(default=None, repr=False, compare=False)

    def _check(self) -> None:
        for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < (0 if name == "num_hidden_layers" else 1):
                raise ValueError(f"{type(self).__name__}: {name} must be a positive int, got {v!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"{type(self).__name__}: hidden_size ({self.hidden_size}) must be a multiple of "
                             f"num_attention_heads ({self.num_attention_heads})")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class BertConfig(_Common):
    """BERT: word + position + token-type embeddings, post-LayerNorm blocks, GELU MLP, tanh pooler."""
    vocab_size: int = 30522
    hidden_act: str = "gelu"
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    add_pooling_layer: bool = True
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    classifier_dropout: float | None = None  # None: hidden_dropout_prob
    model_type: str = "bert"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], **override) -> "BertConfig":
        pet = d.get("position_embedding_type", "absolute")
        if pet not in (None, "absolute"):
            raise ValueError(f"BertConfig: position_embedding_type must be 'absolute', got {pet!r}")
        if d.get("is_decoder") or d.get("add_cross_attention"):
            raise ValueError("BertConfig: decoder BERT (is_decoder / add_cross_attention) is not supported")
        cfg = cls(**_pick(cls, d, num_labels=_num_labels(d), **override))
        cfg._check()
        cfg.hf_config = dict(d)
        return cfg


@dataclass
class ModernBertConfig(_Common):
    """ModernBERT: bias-free LayerNorm, RoPE (theta per layer type), GeGLU, alternating global/local attention."""
    vocab_size: int = 50368
    intermediate_size: int = 1152
    num_hidden_layers: int = 22
    hidden_activation: str = "gelu"
    max_position_embeddings: int = 8192
    norm_eps: float = 1e-5
    norm_bias: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    layer_types: list = field(default_factory=list)
    rope_theta_global: float = 160000.0
    rope_theta_local: float = 10000.0
    local_attention: int = 128
    classifier_pooling: str = "cls"
    classifier_bias: bool = False
    classifier_activation: str = "gelu"
    pad_token_id: int = 50283
    embedding_dropout: float = 0.0
    attention_dropout: float = 0.0
    mlp_dropout: float = 0.0
    classifier_dropout: float = 0.0
    decoder_bias: bool = True  # the masked-LM decoder's bias
    sparse_prediction: bool = False  # transformers' masked-LM logits only at labelled tokens when labels are given
    model_type: str = "modernbert"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], **override) -> "ModernBertConfig":
        n = int(d.get("num_hidden_layers", 22))
        layer_types = d.get("layer_types")
        if not layer_types:
            every = int(d.get("global_attn_every_n_layers", 3))
            layer_types = ["sliding_attention" if i % every else "full_attention" for i in range(n)]
        bad = [t for t in layer_types if t not in ("full_attention", "sliding_attention")]
        if bad or len(layer_types) != n:
            raise ValueError(f"ModernBertConfig: layer_types must list {n} of 'full_attention'/'sliding_attention', "
                             f"got {layer_types!r}")
        rope = d.get("rope_parameters") or {}
        theta = {}
        for kind, legacy, default in (("full_attention", "global_rope_theta", 160000.0),
                                      ("sliding_attention", "local_rope_theta", 10000.0)):
            p = rope.get(kind) or {}
            if p.get("rope_type", "default") != "default":
                raise ValueError(f"ModernBertConfig: only default RoPE is supported, got rope_type "
                                 f"{p.get('rope_type')!r} for {kind}")
            theta[kind] = float(p.get("rope_theta", d.get(legacy, default)))
        pooling = d.get("classifier_pooling", "cls")
        if pooling not in ("cls", "mean"):
            raise ValueError(f"ModernBertConfig: classifier_pooling must be 'cls' or 'mean', got {pooling!r}")
        cfg = cls(**_pick(cls, d, num_labels=_num_labels(d), layer_types=list(layer_types),
                          rope_theta_global=theta["full_attention"], rope_theta_local=theta["sliding_attention"],
                          **override))
        cfg._check()
        cfg.hf_config = dict(d)
        return cfg


@dataclass
class ViTConfig(_Common):
    """ViT: conv patch embedding, CLS token, learned positions, pre-LayerNorm blocks, final norm, pooler."""
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-12
    image_size: int = 224
    patch_size: int = 16
    num_channels: int = 3
    qkv_bias: bool = True
    pooler_output_size: int | None = None
    pooler_act: str = "tanh"
    add_pooling_layer: bool = True
    hidden_dropout_prob: float = 0.0
    attention_probs_dropout_prob: float = 0.0
    model_type: str = "vit"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], **override) -> "ViTConfig":
        vals = _pick(cls, d, num_labels=_num_labels(d), **override)
        for k in ("image_size", "patch_size"):
            v = vals.get(k)
            if isinstance(v, (list, tuple)):
                if len(set(v)) != 1:
                    raise ValueError(f"ViTConfig: only square {k} is supported, got {v!r}")
                vals[k] = int(v[0])
        cfg = cls(**vals)
        if cfg.pooler_output_size is None:
            cfg.pooler_output_size = cfg.hidden_size
        cfg._check()
        if cfg.image_size % cfg.patch_size:
            raise ValueError(f"ViTConfig: image_size ({cfg.image_size}) must be a multiple of patch_size ({cfg.patch_size})")
        cfg.hf_config = dict(d)
        return cfg

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2
