"""The SigLIP vision tower (Zhai et al. 2023, "Sigmoid Loss for Language Image Pre-Training"), as transformers'
SiglipVisionModel: patch embedding with bias, no class token, learned positions (bicubic-interpolated to the
input's patch grid with interpolate_pos_encoding=True, as transformers does), ViT's pre-norm blocks
(fastenc.models.vit, fused QKV) with a tanh-GELU MLP, post_layernorm on every token (the last hidden state), and
the multihead attention-pooling head (vision_use_head): a learned probe token attends over the image's tokens
(torch.nn.MultiheadAttention's packed in_proj), then probe + mlp(layernorm(probe)) is the pooled output.

Usage: model(pixel_values (batch, channels, H, W), interpolate_pos_encoding=False) -> last hidden state
(batch, patches, hidden); model.pool(hidden) -> pooler_output (batch, hidden) (None without the head).
Parameter names: embeddings.{position,patch.weight,patch.bias}, layers.i.{attn_norm,attn.Wqkv,attn.Wo,mlp_norm,
mlp.fc1,mlp.fc2}, norm, head.{probe,in_proj,out_proj,norm,mlp.fc1,mlp.fc2}. transformers 5 names:
embeddings.patch_embedding, embeddings.position_embedding.weight, encoder.layers.N.self_attn.{q,k,v,out}_proj,
layer_norm1/2, mlp.fc1/fc2, post_layernorm, head.{probe,attention.in_proj_weight/bias,attention.out_proj,
layernorm,mlp.fc1/fc2}.
Training: attention_dropout on the encoder's attention probabilities (SigLIP has no other dropout).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from fastenc.layers import MLP, LayerNorm, Linear
from fastenc.models import vit
from fastenc.models.architecture import Architecture, heads_of
from fastenc.models.clip_vision import CLIPVisionLayer
from fastenc.models.config import ViTConfig
from fastenc.models.convert import Entry, lin, qkv
from fastenc.padding import PackedBatch


@dataclass
class SiglipVisionConfig(ViTConfig):
    """SigLIP's vision tower: ViT's fields (patch 16, LayerNorm eps 1e-6, gelu_pytorch_tanh by default) plus
    vision_use_head; attention_dropout is read as attention_probs_dropout_prob; no class token, no pooler layer."""
    hidden_act: str = "gelu_pytorch_tanh"
    layer_norm_eps: float = 1e-6
    vision_use_head: bool = True
    add_pooling_layer: bool = False
    model_type: str = "siglip_vision_model"
    FASTENC_ONLY = ("pooler_output_size", "pooler_act", "qkv_bias", "hidden_dropout_prob",
                    "attention_probs_dropout_prob")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], **override) -> "SiglipVisionConfig":
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


class SiglipVisionEmbeddings(nn.Module):
    """patches (a GEMM over unfolded patches, with bias) + position (patches, hidden); no class token."""

    def __init__(self, cfg: SiglipVisionConfig):
        super().__init__()
        self.cfg = cfg
        p, c, h = cfg.patch_size, cfg.num_channels, cfg.hidden_size
        self.position = nn.Parameter(torch.zeros(cfg.num_patches, h))
        self.patch = Linear(c * p * p, h)

    def positions(self, height: int, width: int, interpolate: bool) -> torch.Tensor:
        """The position table for a (height, width) pixel input: (patches, hidden). As transformers'
        interpolate_pos_encoding: the table itself without interpolation, or when the grid has the table's number
        of patches and the image is square; else the table resized (bicubic, align_corners=False, in its dtype)."""
        pos, p = self.position, self.cfg.patch_size
        n, dim = pos.shape
        gh, gw = height // p, width // p
        if not interpolate or (gh * gw == n and height == width):
            return pos
        side = int(n ** 0.5)
        grid = pos.reshape(1, side, side, dim).permute(0, 3, 1, 2)
        grid = F.interpolate(grid, size=(gh, gw), mode="bicubic", align_corners=False)
        return grid.permute(0, 2, 3, 1).reshape(gh * gw, dim)

    def forward(self, pixel_values: torch.Tensor, interpolate: bool = False) -> torch.Tensor:
        """(batch, C, H, W) -> (batch * patches, hidden), packed image by image (pixels past the last whole patch
        dropped, as the strided convolution does)."""
        b, c, hh, ww = pixel_values.shape
        p = self.cfg.patch_size
        gh, gw = hh // p, ww // p
        px = pixel_values[:, :, :gh * p, :gw * p]
        # (b, c, gh, p, gw, p) -> (b, gh, gw, c, p, p): each patch flattened in the conv weight's (c, kh, kw) order
        patches = px.reshape(b, c, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5).reshape(b * gh * gw, c * p * p)
        x = self.patch(patches).view(b, gh * gw, -1) + self.positions(hh, ww, interpolate)
        return x.reshape(b * gh * gw, -1)


class SiglipAttentionPoolingHead(nn.Module):
    """Multihead attention pooling: a learned probe (1 query per image) attends over the image's tokens with
    torch.nn.MultiheadAttention's math (in_proj (3 * hidden, hidden) packed [q; k; v], scale head_dim^-0.5,
    out_proj), then pooled = a + mlp(norm(a)). hidden (batch, seq, hidden) -> (batch, hidden). Plain PyTorch (one
    query row per image)."""

    def __init__(self, cfg: SiglipVisionConfig):
        super().__init__()
        h = cfg.hidden_size
        self.heads = cfg.num_attention_heads
        self.probe = nn.Parameter(torch.zeros(1, 1, h))
        self.in_proj = Linear(h, 3 * h)
        self.out_proj = Linear(h, h)
        self.norm = LayerNorm(h, cfg.layer_norm_eps)
        self.mlp = MLP(h, cfg.intermediate_size, cfg.hidden_act)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        b, s, h = hidden.shape
        nh, d = self.heads, h // self.heads
        wq, wkv = self.in_proj.weight.split([h, 2 * h])
        bq, bkv = self.in_proj.bias.split([h, 2 * h])
        q = F.linear(self.probe.reshape(1, h), wq, bq).view(1, nh, 1, d).expand(b, nh, 1, d)
        k, v = F.linear(hidden, wkv, bkv).view(b, s, 2, nh, d).permute(2, 0, 3, 1, 4)
        attn = torch.softmax((q * d ** -0.5) @ k.transpose(-1, -2), dim=-1)  # (b, nh, 1, s)
        a = self.out_proj((attn @ v).reshape(b, h))
        return a + self.mlp(self.norm(a))


class SiglipVisionModel(vit.ViTModel):
    """The tower: embeddings, the blocks, post_layernorm (self.norm) on every token -> last_hidden_state;
    pool(hidden) = the attention-pooling head (transformers' pooler_output; None without vision_use_head)."""
    task = "base"

    def __init__(self, config: SiglipVisionConfig):
        nn.Module.__init__(self)
        self.config = config
        h = config.hidden_size
        self.embeddings = SiglipVisionEmbeddings(config)
        self.layers = nn.ModuleList(CLIPVisionLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = LayerNorm(h, config.layer_norm_eps)
        self.head = SiglipAttentionPoolingHead(config) if config.vision_use_head else None
        self.pooler = None

    def _check(self, pixel_values) -> torch.Tensor:
        cfg, name = self.config, type(self).__name__
        if not isinstance(pixel_values, torch.Tensor) or not pixel_values.is_floating_point():
            raise TypeError(f"{name}: pixel_values must be a float tensor, got "
                            f"{getattr(pixel_values, 'dtype', type(pixel_values).__name__)}")
        if pixel_values.dim() != 4 or pixel_values.shape[1] != cfg.num_channels:
            raise ValueError(f"{name}: pixel_values must be (batch, {cfg.num_channels}, height, width), got shape "
                             f"{tuple(pixel_values.shape)}")
        if pixel_values.shape[0] == 0 or min(pixel_values.shape[2:]) < cfg.patch_size:
            raise ValueError(f"{name}: pixel_values must hold at least one image (batch >= 1) of at least "
                             f"{cfg.patch_size} x {cfg.patch_size} pixels (patch_size), got shape "
                             f"{tuple(pixel_values.shape)}")
        w = self.embeddings.patch.weight
        return pixel_values.to(device=w.device, dtype=w.dtype)

    def _encode(self, pixel_values, first_only: bool = False, interpolate_pos_encoding: bool = False):
        """(x (images * patches, hidden) after post_layernorm, PackedBatch). Without interpolate_pos_encoding the
        image must have the config's patch grid (image_size // patch_size on each side)."""
        pixel_values = self._check(pixel_values)
        b, _, hh, ww = pixel_values.shape
        p, n = self.config.patch_size, self.config.num_patches
        s = (hh // p) * (ww // p)
        if not interpolate_pos_encoding and s != n:
            raise ValueError(f"{type(self).__name__}: pixel_values of shape {tuple(pixel_values.shape)} give {s} "
                             f"patches, the position table has {n} (image_size {self.config.image_size}); pass "
                             f"interpolate_pos_encoding=True to resize it")
        batch = PackedBatch(None, b, s, pixel_values.device)
        h = self.embeddings(pixel_values, interpolate_pos_encoding)
        delta = None
        for layer in self.layers:
            h, delta = layer(h, delta, batch)
        if delta is None:
            return self.norm(h), batch
        return self.norm(delta[0], residual=h, input_bias=delta[1], return_residual=False), batch

    def pool(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """The attention-pooling head: (batch, seq, hidden) -> (batch, hidden); None without vision_use_head."""
        return None if self.head is None else self.head(hidden)

    def pooler_output(self, hidden: torch.Tensor) -> torch.Tensor | None:
        return self.pool(hidden)

    def forward(self, pixel_values, interpolate_pos_encoding: bool = False, *, return_packed: bool = False):
        x, batch = self._encode(pixel_values, interpolate_pos_encoding=bool(interpolate_pos_encoding))
        return (x, batch) if return_packed else batch.pad(x)


def weight_map(cfg: SiglipVisionConfig, task: str, prefix: str = "") -> list[Entry]:
    """fastenc name <-> transformers name of every tensor of the tower (prefix: "vision_model." inside the classes
    that hold the tower)."""
    p = prefix
    m: list[Entry] = [
        ("embeddings.position", (f"{p}embeddings.position_embedding.weight",), "copy"),
        ("embeddings.patch.weight", (f"{p}embeddings.patch_embedding.weight",), "patch"),
        ("embeddings.patch.bias", (f"{p}embeddings.patch_embedding.bias",), "copy"),
    ]
    for i in range(cfg.num_hidden_layers):
        f, h = f"layers.{i}", f"{p}encoder.layers.{i}"
        m += lin(f"{f}.attn_norm", f"{h}.layer_norm1")
        m += qkv(f"{f}.attn.Wqkv", tuple(f"{h}.self_attn.{n}_proj" for n in "qkv"))
        m += lin(f"{f}.attn.Wo", f"{h}.self_attn.out_proj")
        m += lin(f"{f}.mlp_norm", f"{h}.layer_norm2")
        m += lin(f"{f}.mlp.fc1", f"{h}.mlp.fc1")
        m += lin(f"{f}.mlp.fc2", f"{h}.mlp.fc2")
    m += lin("norm", f"{p}post_layernorm")
    if cfg.vision_use_head:
        m += [("head.probe", (f"{p}head.probe",), "copy"),
              ("head.in_proj.weight", (f"{p}head.attention.in_proj_weight",), "copy"),
              ("head.in_proj.bias", (f"{p}head.attention.in_proj_bias",), "copy")]
        m += lin("head.out_proj", f"{p}head.attention.out_proj")
        m += lin("head.norm", f"{p}head.layernorm")
        m += lin("head.mlp.fc1", f"{p}head.mlp.fc1")
        m += lin("head.mlp.fc2", f"{p}head.mlp.fc2")
    return m


def tiny_config(task: str = "base", hidden: int = 36, heads: int = 3, layers: int = 2, image: int = 35, patch: int = 7,
                **kw):
    """A small transformers SiglipVisionConfig for tests (Architecture.tiny_config): odd sizes by default."""
    import transformers

    return transformers.SiglipVisionConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                                           intermediate_size=kw.pop("intermediate", 2 * hidden - 7), image_size=image,
                                           patch_size=patch, attn_implementation="eager", **kw)


ARCHITECTURE = Architecture(
    model_type="siglip_vision_model",
    config=SiglipVisionConfig,
    heads=heads_of(SiglipVisionModel),
    weight_map=weight_map,
    head_prefix="vision_model.",
    modality="vision",
    inputs=frozenset({"pixel_values", "interpolate_pos_encoding", "return_dict", "num_items_in_batch"}),
    hf_config=lambda cfg: cfg.hf_fields(),
    lora_targets=("q_proj", "v_proj"),
    pooling="cls",
    base_output="BaseModelOutputWithPooling",
    tiny_config=tiny_config,
)
