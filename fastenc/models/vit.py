"""Vision Transformer (Dosovitskiy et al. 2020): patch embedding as one GEMM over unfolded patches, CLS token,
learned position embeddings, pre-LayerNorm blocks (residual adds fused into the next LayerNorm), fused QKV,
GELU MLP with fused bias, final norm, optional tanh pooler; image-classification head on the CLS token.

Usage: model(pixel_values (batch, channels, H, W)) -> last hidden state (batch, 1 + patches, hidden);
model.pool(hidden) -> pooler output. Parameter names: embeddings.{cls_token,position,patch.weight,patch.bias},
layers.i.{attn_norm,attn.Wqkv,attn.Wo,mlp_norm,mlp.fc1,mlp.fc2}, norm, pooler, classifier.
Training: parameters require grad; model.train() turns on transformers' dropouts (hidden_dropout_prob after the
embeddings and on the attention and MLP outputs, attention_probs_dropout_prob on the attention probabilities);
ViTForImageClassification takes labels= and returns transformers' ImageClassifierOutput with the loss.
The classification head reads the CLS token alone, so its last layer runs its queries, Wo, the norms and the MLP
(and the final norm) on the CLS rows only, keys and values at every token (_encode(first_only=True)).
"""
from __future__ import annotations

import dataclasses
import re

import torch
import torch.nn.functional as F
from torch import nn

from fastenc.layers import MLP, LayerNorm, Linear, SelfAttention, activation
from fastenc.lora import LoraMixin
from fastenc.quant.model import QuantMixin
from fastenc.models import losses
from fastenc.models.architecture import Architecture, heads_of
from fastenc.models.convert import Entry, lin, qkv
from fastenc.models.saving import SaveMixin
from fastenc.models.config import ViTConfig
from fastenc.padding import PackedBatch, gather_rows


class ViTEmbeddings(nn.Module):
    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.cfg = cfg
        p, c, h = cfg.patch_size, cfg.num_channels, cfg.hidden_size
        self.cls_token = nn.Parameter(torch.zeros(1, 1, h))
        self.position = nn.Parameter(torch.zeros(1, cfg.num_patches + 1, h))
        self.patch = Linear(c * p * p, h)  # weight kept as (hidden, channels*p*p): conv weight flattened

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """(batch, C, H, W) -> (batch * (1 + patches), hidden), packed sequence by sequence."""
        b, c, hh, ww = pixel_values.shape
        p, g = self.cfg.patch_size, hh // self.cfg.patch_size
        # (b, c, g, p, g, p) -> (b, g, g, c, p, p): each patch flattened in the conv weight's (c, kh, kw) order
        patches = pixel_values.reshape(b, c, g, p, g, p).permute(0, 2, 4, 1, 3, 5).reshape(b * g * g, c * p * p)
        x = self.patch(patches).view(b, g * g, -1)
        x = torch.cat([self.cls_token.expand(b, 1, -1), x], dim=1) + self.position
        x = x.reshape(b * (g * g + 1), -1)
        p = self.cfg.hidden_dropout_prob
        return F.dropout(x, p, training=True) if self.training and p > 0 else x


class ViTLayer(nn.Module):
    def __init__(self, cfg: ViTConfig):
        super().__init__()
        h = cfg.hidden_size
        self.attn_norm = LayerNorm(h, cfg.layer_norm_eps)
        self.attn = SelfAttention(h, cfg.num_attention_heads, bias=cfg.qkv_bias, out_bias=True,
                                  dropout=cfg.attention_probs_dropout_prob)
        self.mlp_norm = LayerNorm(h, cfg.layer_norm_eps)
        self.mlp = MLP(h, cfg.intermediate_size, cfg.hidden_act)
        self.dropout = cfg.hidden_dropout_prob

    def forward(self, h: torch.Tensor, delta, batch: PackedBatch, rows: torch.Tensor | None = None):
        """One pre-norm block: h += drop(attn(attn_norm(h))); h += drop(mlp(mlp_norm(h))). h: the residual stream
        (tokens, hidden); delta: (y, bias), the previous block's output not yet added to h (the add and the bias
        fused into this block's attn_norm), or None. rows: keys and values at every token, the rest at those rows
        only (h and the result (n, hidden)). Returns (h, delta), this block's output left in delta."""
        p = self.dropout if self.training else 0.0
        y, h = (self.attn_norm(h), h) if delta is None else self.attn_norm(delta[0], residual=h, input_bias=delta[1])
        if rows is not None:
            o = self.attn.attend_rows(y, batch.cu_seqlens, batch.max_seqlen, rows)
            h = gather_rows(h, rows)
            a = _dropped(self.attn.Wo(o, with_bias=p > 0), self.attn.Wo, p)
        else:
            a = _dropped(self.attn(y, batch.cu_seqlens, batch.max_seqlen, out_bias=p > 0), self.attn.Wo, p)
        y, h = self.mlp_norm(a[0], residual=h, input_bias=a[1])
        return h, _dropped(self.mlp(y, out_bias=p > 0), self.mlp.fc2, p)


class ViTModel(QuantMixin, LoraMixin, SaveMixin, nn.Module):
    task = "base"

    def __init__(self, config: ViTConfig):
        super().__init__()
        self.config = config
        self.embeddings = ViTEmbeddings(config)
        self.layers = nn.ModuleList(ViTLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = LayerNorm(config.hidden_size, config.layer_norm_eps)
        self.pooler = (Linear(config.hidden_size, config.pooler_output_size) if config.add_pooling_layer else None)

    def _check(self, pixel_values) -> torch.Tensor:
        cfg, name = self.config, type(self).__name__
        if not isinstance(pixel_values, torch.Tensor) or not pixel_values.is_floating_point():
            raise TypeError(f"{name}: pixel_values must be a float tensor, got "
                            f"{getattr(pixel_values, 'dtype', type(pixel_values).__name__)}")
        want = (cfg.num_channels, cfg.image_size, cfg.image_size)
        if pixel_values.dim() != 4 or tuple(pixel_values.shape[1:]) != want:
            raise ValueError(f"{name}: pixel_values must be (batch, {want[0]}, {want[1]}, {want[2]}), got shape "
                             f"{tuple(pixel_values.shape)}")
        if pixel_values.shape[0] == 0:
            raise ValueError(f"{name}: pixel_values must hold at least one image (batch >= 1), got shape "
                             f"{tuple(pixel_values.shape)}")
        w = self.embeddings.patch.weight
        return pixel_values.to(device=w.device, dtype=w.dtype)

    def _encode(self, pixel_values, first_only: bool = False):
        """(x (images * tokens, hidden) after the final norm, PackedBatch). first_only=True: x is (images, hidden),
        each image's first token (the CLS token) only: the last layer projects keys and values at every token but
        runs its queries (SelfAttention.attend_rows), Wo, its norms and its MLP, and the final norm, on those rows
        alone (what a head reading the CLS token needs)."""
        pixel_values = self._check(pixel_values)
        b, s = pixel_values.shape[0], self.embeddings.position.shape[1]  # patches + the prepended tokens
        batch = PackedBatch(None, b, s, pixel_values.device)
        h = self.embeddings(pixel_values)
        delta = None  # the last block's output (fc2's, its bias left to the next norm)
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):  # the last one at the CLS rows only, with first_only
            h, delta = layer(h, delta, batch, batch.first_rows() if first_only and i == last else None)
        if delta is None:
            x = self.norm(h)
            return (batch.first_tokens(x) if first_only else x), batch
        return self.norm(delta[0], residual=h, input_bias=delta[1], return_residual=False), batch

    def pool(self, hidden: torch.Tensor) -> torch.Tensor:
        """act(dense(hidden[:, 0])): (batch, seq, hidden) -> (batch, pooler_output_size)."""
        if self.pooler is None:
            raise ValueError(f"{type(self).__name__}: this model has no pooler (add_pooling_layer=False)")
        return activation(self.config.pooler_act, self.pooler(hidden[:, 0], with_bias=False),
                          self.pooler.output_bias())

    def forward(self, pixel_values, *, return_packed: bool = False):
        x, batch = self._encode(pixel_values)
        return (x, batch) if return_packed else batch.pad(x)


def _dropped(y: torch.Tensor, linear: Linear, p: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(dropout(y), None) when p > 0 (y already holds the linear's bias); (y, the linear's bias) otherwise, the bias
    left to the next LayerNorm."""
    if p > 0:
        return F.dropout(y, p, training=True), None
    return y, linear.output_bias()


class ViTForImageClassification(ViTModel):
    """logits = classifier(hidden[:, 0]) after the final norm: (batch, num_labels).
    labels= (batch,) int / float (see fastenc.models.losses) -> transformers' ImageClassifierOutput(loss, logits);
    num_items_in_batch (single-label): the cross-entropy summed and divided by it, as transformers' loss does."""
    task = "image_classification"

    def __init__(self, config: ViTConfig):
        config = dataclasses.replace(config, add_pooling_layer=False)
        super().__init__(config)
        self.classifier = Linear(config.hidden_size, config.num_labels) if config.num_labels > 0 else None

    def forward(self, pixel_values, labels=None, num_items_in_batch=None):
        kind = losses.check_image_labels(self, pixel_values, labels)
        cls, _ = self._encode(pixel_values, first_only=True)  # the last layer past attention at the CLS rows only
        logits = cls if self.classifier is None else self.classifier(cls)
        if labels is None:
            return logits
        loss = losses.sequence_loss(self.config, kind, logits, labels, num_items_in_batch)
        return losses.output(self.task, loss, logits)


def weight_map(cfg: ViTConfig, task: str, prefix: str = "") -> list[Entry]:
    """fastenc name <-> transformers name of every ViT tensor (prefix: "vit." inside the head classes)."""
    p = prefix
    m: list[Entry] = [
        ("embeddings.cls_token", (f"{p}embeddings.cls_token",), "copy"),
        ("embeddings.position", (f"{p}embeddings.position_embeddings",), "copy"),
        ("embeddings.patch.weight", (f"{p}embeddings.patch_embeddings.projection.weight",), "patch"),
        ("embeddings.patch.bias", (f"{p}embeddings.patch_embeddings.projection.bias",), "copy"),
    ]
    for i in range(cfg.num_hidden_layers):
        f, h = f"layers.{i}", f"{p}layers.{i}"
        m += lin(f"{f}.attn_norm", f"{h}.layernorm_before")
        m += qkv(f"{f}.attn.Wqkv", tuple(f"{h}.attention.{n}_proj" for n in "qkv"), cfg.qkv_bias)
        m += lin(f"{f}.attn.Wo", f"{h}.attention.o_proj")
        m += lin(f"{f}.mlp_norm", f"{h}.layernorm_after")
        m += lin(f"{f}.mlp.fc1", f"{h}.mlp.fc1")
        m += lin(f"{f}.mlp.fc2", f"{h}.mlp.fc2")
    m += lin("norm", f"{p}layernorm")
    if cfg.add_pooling_layer:
        m += lin("pooler", f"{p}pooler.dense")
    if task == "image_classification" and cfg.num_labels > 0:
        m += lin("classifier", "classifier")
    return m


LEGACY_NAMES = (  # ViT before transformers 5 (encoder.layer.N.attention.attention.query ...)
    (re.compile(r"^(vit\.)?encoder\.layer\.(\d+)\.attention\.attention\.(query|key|value)\."),
     lambda mt: f"{mt[1] or ''}layers.{mt[2]}.attention.{mt[3][0]}_proj."),
    (re.compile(r"^(vit\.)?encoder\.layer\.(\d+)\.attention\.output\.dense\."),
     lambda mt: f"{mt[1] or ''}layers.{mt[2]}.attention.o_proj."),
    (re.compile(r"^(vit\.)?encoder\.layer\.(\d+)\.intermediate\.dense\."), lambda mt: f"{mt[1] or ''}layers.{mt[2]}.mlp.fc1."),
    (re.compile(r"^(vit\.)?encoder\.layer\.(\d+)\.output\.dense\."), lambda mt: f"{mt[1] or ''}layers.{mt[2]}.mlp.fc2."),
    (re.compile(r"^(vit\.)?encoder\.layer\.(\d+)\.(layernorm_before|layernorm_after)\."),
     lambda mt: f"{mt[1] or ''}layers.{mt[2]}.{mt[3]}."),
)


def pooler_override(task: str, has_pooler: bool) -> dict:
    """The base model has a pooler when the checkpoint holds one; the classification head has none."""
    return {"add_pooling_layer": has_pooler if task == "base" else False}


def tiny_config(task: str = "base", hidden: int = 64, heads: int = 4, layers: int = 2, image: int = 224,
                patch: int = 16, **kw):
    """A small transformers ViTConfig for tests (Architecture.tiny_config)."""
    import transformers

    return transformers.ViTConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                                  intermediate_size=2 * hidden, image_size=image, patch_size=patch, num_labels=4,
                                  attn_implementation="eager", **kw)


ARCHITECTURE = Architecture(
    model_type="vit",
    config=ViTConfig,
    heads=heads_of(ViTModel, ViTForImageClassification),
    weight_map=weight_map,
    head_prefix="vit.",
    modality="vision",
    inputs=frozenset({"pixel_values", "return_dict", "num_items_in_batch"}),
    encoder_of=("ViTForMaskedImageModeling",),
    legacy_names=LEGACY_NAMES,
    config_overrides=pooler_override,
    lora_targets=("q_proj", "v_proj"),
    pooling="cls",
    base_output="BaseModelOutputWithPooling",
    tiny_config=tiny_config,
)
