"""The CLIP vision tower (Radford et al. 2021, "Learning Transferable Visual Models From Natural Language
Supervision"), as transformers' CLIPVisionModel / CLIPVisionModelWithProjection: patch embedding without bias,
class embedding, learned positions, a LayerNorm before the blocks (pre_layrnorm), ViT's pre-norm blocks
(fastenc.models.vit, fused QKV) with a quick-GELU MLP, no final norm on the hidden states; the pooled output is
post_layernorm([CLS]) and the projection head maps it to the joint embedding space (image_embeds).

Usage: model(pixel_values (batch, channels, image_size, image_size)) -> last hidden state (batch, 1 + patches,
hidden) (CLIPVisionModel) or image_embeds (batch, projection_dim) (CLIPVisionModelWithProjection);
model.pool(hidden) -> pooler_output (batch, hidden). Parameter names: embeddings.{cls_token,position,patch.weight},
pre_norm, layers.i.{attn_norm,attn.Wqkv,attn.Wo,mlp_norm,mlp.fc1,mlp.fc2}, post_norm, visual_projection.
transformers 5 names (embeddings.class_embedding, embeddings.position_embedding.weight, pre_layrnorm,
encoder.layers.N.self_attn.{q,k,v,out}_proj, layer_norm1/2, mlp.fc1/fc2, post_layernorm; "vision_model." inside
the projection class, and in CLIPVisionModel checkpoints written before transformers 5, which load too).
Training: attention_dropout on the attention probabilities (CLIP has no other dropout); no labels (no head takes any).
The resolution is the config's: transformers' interpolate_pos_encoding=True is not served (fastenc.accelerate runs
transformers' forward for it, with a warning).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch
from torch import nn

from fastenc.layers import MLP, LayerNorm, Linear, SelfAttention
from fastenc.models import vit
from fastenc.models.architecture import Architecture, heads_of
from fastenc.models.config import ViTConfig
from fastenc.models.convert import Entry, lin, qkv
from fastenc.padding import PackedBatch


@dataclass
class CLIPVisionConfig(ViTConfig):
    """CLIP's vision tower: ViT's fields (patch 32, LayerNorm eps 1e-5, quick_gelu by default) plus projection_dim;
    attention_dropout is read as attention_probs_dropout_prob; no pooler layer, no QKV switch (biases always)."""
    patch_size: int = 32
    hidden_act: str = "quick_gelu"
    layer_norm_eps: float = 1e-5
    projection_dim: int = 512
    add_pooling_layer: bool = False
    model_type: str = "clip_vision_model"
    # fastenc fields save_pretrained leaves out of config.json (transformers has no such key, or another name)
    FASTENC_ONLY = ("pooler_output_size", "pooler_act", "qkv_bias", "hidden_dropout_prob",
                    "attention_probs_dropout_prob")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], **override) -> "CLIPVisionConfig":
        vals = dict(d)
        vals["attention_probs_dropout_prob"] = float(d.get("attention_dropout") or 0.0)
        vals.pop("hidden_dropout_prob", None)
        vals.pop("qkv_bias", None)
        cfg = super().from_dict(vals, **override)
        cfg.hf_config = dict(d)
        return cfg

    def hf_fields(self) -> dict:
        """config.json entries under transformers' names that differ from the fastenc field names."""
        return {"attention_dropout": self.attention_probs_dropout_prob}


class CLIPVisionEmbeddings(nn.Module):
    """[CLS] (the class embedding) + patches (a GEMM without bias over unfolded patches) + position (1 + patches,
    hidden)."""

    def __init__(self, cfg: CLIPVisionConfig):
        super().__init__()
        self.cfg = cfg
        p, c, h = cfg.patch_size, cfg.num_channels, cfg.hidden_size
        self.cls_token = nn.Parameter(torch.zeros(h))
        self.position = nn.Parameter(torch.zeros(cfg.num_patches + 1, h))
        self.patch = Linear(c * p * p, h, bias=False)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """(batch, C, H, W) -> (batch * (1 + patches), hidden), packed image by image."""
        b, c, hh, _ = pixel_values.shape
        p, g = self.cfg.patch_size, hh // self.cfg.patch_size
        # (b, c, g, p, g, p) -> (b, g, g, c, p, p): each patch flattened in the conv weight's (c, kh, kw) order
        patches = pixel_values.reshape(b, c, g, p, g, p).permute(0, 2, 4, 1, 3, 5).reshape(b * g * g, c * p * p)
        x = self.patch(patches).view(b, g * g, -1)
        x = torch.cat([self.cls_token.view(1, 1, -1).expand(b, 1, -1), x], dim=1) + self.position
        return x.reshape(b * (g * g + 1), -1)


class CLIPVisionLayer(vit.ViTLayer):
    """ViT's pre-norm block (forward inherited) with CLIP's MLP (quick_gelu by default: fastenc.ops.gelu's "quick"
    form, the bias fused, in place after the fc1 GEMM); attention dropout only."""

    def __init__(self, cfg: CLIPVisionConfig):
        nn.Module.__init__(self)
        h = cfg.hidden_size
        self.attn_norm = LayerNorm(h, cfg.layer_norm_eps)
        self.attn = SelfAttention(h, cfg.num_attention_heads, bias=True, out_bias=True,
                                  dropout=cfg.attention_probs_dropout_prob)
        self.mlp_norm = LayerNorm(h, cfg.layer_norm_eps)
        self.mlp = MLP(h, cfg.intermediate_size, cfg.hidden_act)
        self.dropout = 0.0


class CLIPVisionModel(vit.ViTModel):
    """The tower: embeddings, pre_layrnorm, the blocks; last_hidden_state without a final norm; pool(hidden) =
    post_layernorm(hidden[:, 0]) (transformers' pooler_output)."""
    task = "base"

    def __init__(self, config: CLIPVisionConfig):
        nn.Module.__init__(self)
        self.config = config
        h = config.hidden_size
        self.embeddings = CLIPVisionEmbeddings(config)
        self.pre_norm = LayerNorm(h, config.layer_norm_eps)
        self.layers = nn.ModuleList(CLIPVisionLayer(config) for _ in range(config.num_hidden_layers))
        self.post_norm = LayerNorm(h, config.layer_norm_eps)
        self.pooler = None

    def _encode(self, pixel_values, first_only: bool = False):
        """(x (images * tokens, hidden), the last block's output (no final norm), PackedBatch)."""
        pixel_values = self._check(pixel_values)
        b, s = pixel_values.shape[0], self.embeddings.position.shape[0]
        batch = PackedBatch(None, b, s, pixel_values.device)
        h = self.pre_norm(self.embeddings(pixel_values))
        delta = None
        for layer in self.layers:
            h, delta = layer(h, delta, batch)
        if delta is not None:
            h = h + delta[0] if delta[1] is None else torch.add(h, delta[0]).add_(delta[1])
        return h, batch

    def pool(self, hidden: torch.Tensor) -> torch.Tensor:
        """post_layernorm(hidden[:, 0]): (batch, seq, hidden) -> (batch, hidden)."""
        return self.post_norm(hidden[:, 0].contiguous())

    def pooler_output(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.pool(hidden)


class CLIPVisionModelWithProjection(CLIPVisionModel):
    """image_embeds = visual_projection(post_layernorm([CLS])): (batch, projection_dim). hf_forward gives
    transformers' CLIPVisionModelOutput fields (image_embeds, last_hidden_state)."""
    task = "image_embedding"

    def __init__(self, config: CLIPVisionConfig):
        super().__init__(config)
        self.visual_projection = Linear(config.hidden_size, config.projection_dim, bias=False)

    def hf_forward(self, pixel_values) -> dict:
        x, batch = self._encode(pixel_values)
        hidden = batch.pad(x)
        return {"image_embeds": self.visual_projection(self.pool(hidden)), "last_hidden_state": hidden}

    def forward(self, pixel_values):
        return self.hf_forward(pixel_values)["image_embeds"]


def weight_map(cfg: CLIPVisionConfig, task: str, prefix: str = "") -> list[Entry]:
    """fastenc name <-> transformers name of every tensor of the tower (prefix: "vision_model." inside
    CLIPVisionModelWithProjection)."""
    p = prefix
    m: list[Entry] = [
        ("embeddings.cls_token", (f"{p}embeddings.class_embedding",), "copy"),
        ("embeddings.position", (f"{p}embeddings.position_embedding.weight",), "copy"),
        ("embeddings.patch.weight", (f"{p}embeddings.patch_embedding.weight",), "patch"),
    ]
    m += lin("pre_norm", f"{p}pre_layrnorm")
    for i in range(cfg.num_hidden_layers):
        f, h = f"layers.{i}", f"{p}encoder.layers.{i}"
        m += lin(f"{f}.attn_norm", f"{h}.layer_norm1")
        m += qkv(f"{f}.attn.Wqkv", tuple(f"{h}.self_attn.{n}_proj" for n in "qkv"))
        m += lin(f"{f}.attn.Wo", f"{h}.self_attn.out_proj")
        m += lin(f"{f}.mlp_norm", f"{h}.layer_norm2")
        m += lin(f"{f}.mlp.fc1", f"{h}.mlp.fc1")
        m += lin(f"{f}.mlp.fc2", f"{h}.mlp.fc2")
    m += lin("post_norm", f"{p}post_layernorm")
    if task == "image_embedding":
        m += lin("visual_projection", "visual_projection", bias=False)
    return m


def tiny_config(task: str = "base", hidden: int = 36, heads: int = 3, layers: int = 2, image: int = 35, patch: int = 7,
                **kw):
    """A small transformers CLIPVisionConfig for tests (Architecture.tiny_config): odd sizes by default."""
    import transformers

    return transformers.CLIPVisionConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                                         intermediate_size=kw.pop("intermediate", 2 * hidden - 7), image_size=image,
                                         patch_size=patch, attn_implementation="eager",
                                         **{"projection_dim": 20, **kw})


ARCHITECTURE = Architecture(
    model_type="clip_vision_model",
    config=CLIPVisionConfig,
    heads=heads_of(CLIPVisionModel, CLIPVisionModelWithProjection),
    weight_map=weight_map,
    head_prefix="vision_model.",
    modality="vision",
    inputs=frozenset({"pixel_values", "return_dict", "num_items_in_batch"}),
    hf_config=lambda cfg: cfg.hf_fields(),
    lora_targets=("q_proj", "v_proj"),
    pooling="cls",
    base_output="BaseModelOutputWithPooling",
    head_outputs={"image_embedding": "transformers.models.clip.modeling_clip:CLIPVisionModelOutput"},
    tiny_config=tiny_config,
)
