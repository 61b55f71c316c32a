"""DeiT (Touvron et al. 2021, "Training data-efficient image transformers & distillation through attention"): the
ViT encoder of fastenc.models.vit with a second prepended token, the distillation token, after [CLS]; the
learned position table covers num_patches + 2 tokens. Heads: the bare encoder (optional tanh pooler on [CLS]),
image classification on [CLS] (as ViT), and the distilled head: cls_classifier on [CLS] and
distillation_classifier on the distillation token, logits = their average (transformers' inference output).

Usage: model(pixel_values (batch, channels, H, W)) -> last hidden state (batch, 2 + patches, hidden).
Parameter names: those of fastenc.models.vit plus embeddings.distillation_token; the distilled head has
cls_classifier and distillation_classifier. transformers 5 names (DeiTModel: embeddings.*, layers.N.attention.
{q,k,v,o}_proj, layers.N.mlp.fc{1,2}, layernorm, pooler.dense; "deit." inside the head classes); the older
checkpoint layout (deit.encoder.layer.N.attention.attention.query ...) is renamed on load.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fastenc.layers import Linear
from fastenc.models import vit
from fastenc.models.architecture import Architecture, heads_of
from fastenc.models.config import ViTConfig
from fastenc.models.convert import Entry, lin


@dataclass
class DeiTConfig(ViTConfig):
    """DeiT: ViT's fields (224 px, patch 16, hidden 768 by default); model_type "deit"."""
    encoder_stride: int = 16  # (the masked-image-modeling decoder's; kept for save_pretrained)
    model_type: str = "deit"


class DeiTEmbeddings(vit.ViTEmbeddings):
    """[CLS], distillation token, patches; + position (1, num_patches + 2, hidden)."""

    def __init__(self, cfg: DeiTConfig):
        super().__init__(cfg)
        h = cfg.hidden_size
        self.distillation_token = nn.Parameter(torch.zeros(1, 1, h))
        self.position = nn.Parameter(torch.zeros(1, cfg.num_patches + 2, h))

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """(batch, C, H, W) -> (batch * (2 + patches), hidden), packed image by image."""
        b, c, hh, _ = pixel_values.shape
        p, g = self.cfg.patch_size, hh // self.cfg.patch_size
        # (b, c, g, p, g, p) -> (b, g, g, c, p, p): each patch flattened in the conv weight's (c, kh, kw) order
        patches = pixel_values.reshape(b, c, g, p, g, p).permute(0, 2, 4, 1, 3, 5).reshape(b * g * g, c * p * p)
        x = self.patch(patches).view(b, g * g, -1)
        x = torch.cat([self.cls_token.expand(b, 1, -1), self.distillation_token.expand(b, 1, -1), x], dim=1)
        x = (x + self.position).reshape(b * (g * g + 2), -1)
        p = self.cfg.hidden_dropout_prob
        return F.dropout(x, p, training=True) if self.training and p > 0 else x


class DeiTModel(vit.ViTModel):
    """The DeiT encoder: ViT's blocks and final norm over [CLS], distillation token and patches."""
    task = "base"

    def __init__(self, config: DeiTConfig):
        super().__init__(config)
        self.embeddings = DeiTEmbeddings(self.config)  # (the config a head may have adjusted)


class DeiTForImageClassification(DeiTModel, vit.ViTForImageClassification):
    """logits = classifier(hidden[:, 0]) ([CLS] after the final norm): (batch, num_labels); labels= as ViT's head
    (transformers' ImageClassifierOutput with the loss)."""
    task = "image_classification"


class DeiTForImageClassificationWithTeacher(DeiTModel):
    """cls_logits = cls_classifier(hidden[:, 0]), distillation_logits = distillation_classifier(hidden[:, 1]),
    logits = (cls_logits + distillation_logits) / 2: each (batch, num_labels) (the hidden state itself when
    num_labels == 0, as transformers' Identity heads). No labels: transformers' class takes none."""
    task = "image_classification_with_teacher"

    def __init__(self, config: DeiTConfig):
        config = dataclasses.replace(config, add_pooling_layer=False)
        super().__init__(config)
        n, h = config.num_labels, config.hidden_size
        self.cls_classifier = Linear(h, n) if n > 0 else None
        self.distillation_classifier = Linear(h, n) if n > 0 else None

    def hf_forward(self, pixel_values) -> dict:
        """transformers' DeiTForImageClassificationWithTeacherOutput fields: logits, cls_logits,
        distillation_logits."""
        x, batch = self._encode(pixel_values)
        tokens = x.view(batch.batch, batch.seq, -1)
        cls, dist = tokens[:, 0], tokens[:, 1]
        if self.cls_classifier is not None:
            cls, dist = self.cls_classifier(cls), self.distillation_classifier(dist)
        return {"logits": (cls + dist) / 2, "cls_logits": cls, "distillation_logits": dist}

    def forward(self, pixel_values):
        return self.hf_forward(pixel_values)["logits"]


def weight_map(cfg: DeiTConfig, task: str, prefix: str = "") -> list[Entry]:
    """fastenc name <-> transformers name of every DeiT tensor (prefix: "deit." inside the head classes): ViT's
    encoder map, the distillation token, and the head's classifiers."""
    m = vit.weight_map(cfg, "image_classification" if task == "image_classification" else "base", prefix)
    m.append(("embeddings.distillation_token", (f"{prefix}embeddings.distillation_token",), "copy"))
    if task == "image_classification_with_teacher" and cfg.num_labels > 0:
        m += lin("cls_classifier", "cls_classifier")
        m += lin("distillation_classifier", "distillation_classifier")
    return m


def _layer(rest: str):
    return lambda mt: f"{mt[1] or ''}layers.{mt[2]}.{rest.format(*mt.groups())}"


LEGACY_NAMES = (  # DeiT before transformers 5 (deit.encoder.layer.N.attention.attention.query ...)
    (re.compile(r"^(deit\.)?encoder\.layer\.(\d+)\.attention\.attention\.(query|key|value)\."),
     lambda mt: f"{mt[1] or ''}layers.{mt[2]}.attention.{mt[3][0]}_proj."),
    (re.compile(r"^(deit\.)?encoder\.layer\.(\d+)\.attention\.output\.dense\."), _layer("attention.o_proj.")),
    (re.compile(r"^(deit\.)?encoder\.layer\.(\d+)\.intermediate\.dense\."), _layer("mlp.fc1.")),
    (re.compile(r"^(deit\.)?encoder\.layer\.(\d+)\.output\.dense\."), _layer("mlp.fc2.")),
    (re.compile(r"^(deit\.)?encoder\.layer\.(\d+)\.(layernorm_before|layernorm_after)\."), _layer("{2}.")),
)


def tiny_config(task: str = "base", hidden: int = 64, heads: int = 4, layers: int = 2, image: int = 32, patch: int = 8,
                **kw):
    """A small transformers DeiTConfig for tests (Architecture.tiny_config)."""
    import transformers

    return transformers.DeiTConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                                   intermediate_size=2 * hidden, image_size=image, patch_size=patch,
                                   attn_implementation="eager", **{"num_labels": 4, **kw})


ARCHITECTURE = Architecture(
    model_type="deit",
    config=DeiTConfig,
    heads=heads_of(DeiTModel, DeiTForImageClassification, DeiTForImageClassificationWithTeacher),
    weight_map=weight_map,
    head_prefix="deit.",
    modality="vision",
    inputs=vit.ARCHITECTURE.inputs,
    encoder_of=("DeiTForMaskedImageModeling",),
    legacy_names=LEGACY_NAMES,
    config_overrides=vit.pooler_override,
    lora_targets=("q_proj", "v_proj"),
    pooling="cls",
    base_output="BaseModelOutputWithPooling",
    head_outputs={"image_classification_with_teacher":
                  "transformers.models.deit.modeling_deit:DeiTForImageClassificationWithTeacherOutput"},
    tiny_config=tiny_config,
)
