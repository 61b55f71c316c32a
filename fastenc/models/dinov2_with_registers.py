"""DINOv2 with registers (Darcet et al. 2024, "Vision Transformers Need Registers"), as transformers'
Dinov2WithRegistersModel / Dinov2WithRegistersForImageClassification: the DINOv2 encoder of fastenc.models.dinov2
with `num_register_tokens` learned tokens inserted after [CLS] (after the position embeddings are added: they have no
position), the position table resampled with antialiasing, and the classifier's patch mean over the patch tokens
only (registers excluded).

Usage: model(pixel_values (batch, channels, H, W)) -> last hidden state (batch, 1 + registers + patches, hidden).
Parameter names: those of fastenc.models.dinov2 plus embeddings.registers (transformers'
embeddings.register_tokens, "dinov2_with_registers." inside the head class). Layer scale, training and saving as
fastenc.models.dinov2 describes.
"""
from __future__ import annotations

from dataclasses import dataclass

from fastenc.models import dinov2
from fastenc.models.architecture import Architecture, heads_of


@dataclass
class Dinov2WithRegistersConfig(dinov2.Dinov2Config):
    """DINOv2's fields with num_register_tokens (4 by default), patch 16; the mask token is always present."""
    patch_size: int = 16
    num_register_tokens: int = 4
    use_mask_token: bool = True
    model_type: str = "dinov2_with_registers"
    FASTENC_ONLY = ("intermediate_size", "pooler_output_size", "pooler_act", "use_mask_token")

    @classmethod
    def from_dict(cls, d, **override) -> "Dinov2WithRegistersConfig":
        cfg = super().from_dict({**d, "use_mask_token": True}, **override)
        if not isinstance(cfg.num_register_tokens, int) or cfg.num_register_tokens < 0:
            raise ValueError(f"{cls.__name__}: num_register_tokens must be an int >= 0, got "
                             f"{cfg.num_register_tokens!r}")
        cfg.hf_config = dict(d)
        return cfg


class Dinov2WithRegistersModel(dinov2.Dinov2Model):
    """The encoder: [CLS], registers, patches (bicubic position resampling with antialias, as transformers')."""
    task = "base"
    antialias = True


class Dinov2WithRegistersForImageClassification(Dinov2WithRegistersModel, dinov2.Dinov2ForImageClassification):
    """logits = classifier([hidden[:, 0] ; mean(hidden[:, 1 + num_register_tokens:])]): (batch, num_labels)."""
    task = "image_classification"


def tiny_config(task: str = "base", hidden: int = 36, heads: int = 3, layers: int = 2, image: int = 35,
                patch: int = 7, **kw):
    """A small transformers Dinov2WithRegistersConfig for tests (Architecture.tiny_config): odd sizes, 3 registers."""
    import transformers

    return transformers.Dinov2WithRegistersConfig(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, mlp_ratio=kw.pop("mlp_ratio", 3),
        image_size=image, patch_size=patch, attn_implementation="eager",
        **{"num_labels": 5, "num_register_tokens": 3, **kw})


ARCHITECTURE = Architecture(
    model_type="dinov2_with_registers",
    config=Dinov2WithRegistersConfig,
    heads=heads_of(Dinov2WithRegistersModel, Dinov2WithRegistersForImageClassification),
    weight_map=dinov2.weight_map,
    head_prefix="dinov2_with_registers.",
    modality="vision",
    inputs=dinov2.ARCHITECTURE.inputs,
    encoder_of=("Dinov2WithRegistersBackbone",),
    legacy_names=dinov2.legacy_names("dinov2_with_registers."),
    config_overrides=dinov2.no_pooler,
    lora_targets=("q_proj", "v_proj"),
    pooling="cls",
    base_output="BaseModelOutputWithPooling",
    tiny_config=tiny_config,
)
