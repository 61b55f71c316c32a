"""DINOv2 (Oquab et al. 2023, "DINOv2: Learning Robust Visual Features without Supervision"), as transformers'
Dinov2Model / Dinov2ForImageClassification: the ViT encoder of fastenc.models.vit with layer scale (a learned
per-channel factor lambda on each block's attention and MLP output), a GELU MLP or a SwiGLU FFN
(`use_swiglu_ffn`), position embeddings interpolated (bicubic) to the input's resolution, and a classifier on
[CLS ; mean of the patch tokens]. fastenc.models.dinov2_with_registers adds register tokens after [CLS].

Usage: model(pixel_values (batch, channels, H, W)) -> last hidden state (batch, 1 + (H // p) * (W // p), hidden),
any H, W >= patch_size (the last H % p rows and W % p columns are dropped, as transformers' strided conv does).
Parameter names: embeddings.{cls_token,mask_token,position,patch.weight,patch.bias}, layers.i.{attn_norm,attn.Wqkv,
attn.Wo,ls1,mlp_norm,mlp.fc1,mlp.fc2 | mlp.gate_proj,mlp.up_proj,mlp.down_proj,ls2}, norm, classifier.

Layer scale. Loaded for inference, lambda is folded into the output projection of its branch (attn.Wo and mlp.fc2 /
mlp.down_proj hold lambda * W and lambda * b: the weight map's "scale" kind), so a block costs what a ViT block
costs; ls1 / ls2 keep lambda itself, and save_pretrained divides it back out (transformers' o_proj / fc2 and
layer_scale{1,2}.lambda1). Training needs lambda as its own parameter: model.train() unfolds in place (Wo, fc2 back
to W, b; the forward then multiplies each branch's output by ls1 / ls2, so the gradients of W, b and lambda are
transformers'), model.eval() folds again. A fold and an unfold round W by at most one ulp; a lambda with a zero
channel cannot be unfolded and train() says so. The module made by fastenc.accelerate keeps the folded form in
training too: its weights are computed per call from transformers' (lambda * W, differentiable in both).
Dropout: hidden_dropout_prob after the embeddings, attention_probs_dropout_prob on the attention probabilities (the
blocks have no other dropout, as transformers'); stochastic depth (drop_path_rate > 0) is refused in training (a
no-op at inference). The mask token is kept for save_pretrained and not used (bool_masked_pos is not served).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from fastenc.layers import MLP, LayerNorm, Linear, SelfAttention
from fastenc.lora import LoraMixin
from fastenc.models import losses
from fastenc.models.architecture import Architecture, heads_of
from fastenc.models.config import ViTConfig, _num_labels, _pick
from fastenc.models.convert import Entry, lin, qkv
from fastenc.models.saving import SaveMixin
from fastenc.padding import PackedBatch
from fastenc.quant.model import QuantMixin


@dataclass
class Dinov2Config(ViTConfig):
    """DINOv2: ViT's fields plus mlp_ratio (the MLP width is int(hidden_size * mlp_ratio); the SwiGLU FFN's
    two thirds of it rounded up to a multiple of 8), layerscale_value, drop_path_rate, use_swiglu_ffn and
    use_mask_token; 224 px, patch 14, LayerNorm eps 1e-6 by default; no pooler."""
    layer_norm_eps: float = 1e-6
    patch_size: int = 14
    mlp_ratio: float = 4
    layerscale_value: float = 1.0
    drop_path_rate: float = 0.0
    use_swiglu_ffn: bool = False
    use_mask_token: bool = True
    num_register_tokens: int = 0  # (dinov2_with_registers)
    add_pooling_layer: bool = False
    model_type: str = "dinov2"
    # fastenc fields save_pretrained leaves out of config.json (transformers derives or has no such key)
    FASTENC_ONLY = ("intermediate_size", "pooler_output_size", "pooler_act", "num_register_tokens")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], **override) -> "Dinov2Config":
        name = cls.__name__
        vals = _pick(cls, d, num_labels=_num_labels(d), **override)
        for k in ("image_size", "patch_size"):
            v = vals.get(k)
            if isinstance(v, (list, tuple)):
                if len(set(v)) != 1:
                    raise ValueError(f"{name}: only square {k} is supported, got {v!r}")
                vals[k] = int(v[0])
        hidden, ratio = vals.get("hidden_size", cls.hidden_size), vals.get("mlp_ratio", cls.mlp_ratio)
        if not isinstance(ratio, (int, float)) or ratio <= 0:
            raise ValueError(f"{name}: mlp_ratio must be a positive number, got {ratio!r}")
        width = int(hidden * ratio)
        if vals.get("use_swiglu_ffn"):
            width = (int(width * 2 / 3) + 7) // 8 * 8
        vals["intermediate_size"] = width
        cfg = cls(**vals)
        cfg.pooler_output_size = cfg.hidden_size
        cfg._check()
        if cfg.patch_size < 1 or cfg.image_size < cfg.patch_size:
            raise ValueError(f"{name}: image_size ({cfg.image_size}) must be at least patch_size ({cfg.patch_size})")
        if cfg.drop_path_rate < 0 or cfg.drop_path_rate >= 1:
            raise ValueError(f"{name}: drop_path_rate must be in [0, 1), got {cfg.drop_path_rate!r}")
        cfg.hf_config = dict(d)
        return cfg


class Dinov2Embeddings(nn.Module):
    """[CLS] + patches (+ position, interpolated to the input's patch grid), then the register tokens after [CLS]
    when the config has any (no position of their own). antialias: the bicubic resampling's (transformers: False
    for dinov2, True for dinov2_with_registers)."""

    def __init__(self, cfg: Dinov2Config, antialias: bool = False):
        super().__init__()
        self.cfg, self.antialias = cfg, antialias
        p, c, h = cfg.patch_size, cfg.num_channels, cfg.hidden_size
        self.cls_token = nn.Parameter(torch.zeros(1, 1, h))
        self.mask_token = nn.Parameter(torch.zeros(1, h)) if cfg.use_mask_token else None  # (not used)
        self.position = nn.Parameter(torch.zeros(1, cfg.num_patches + 1, h))
        self.registers = (nn.Parameter(torch.zeros(1, cfg.num_register_tokens, h)) if cfg.num_register_tokens
                          else None)
        self.patch = Linear(c * p * p, h)  # weight kept as (hidden, channels*p*p): conv weight flattened

    def positions(self, height: int, width: int) -> torch.Tensor:
        """The position table for a (height, width) pixel input: (1, 1 + (height // p) * (width // p), hidden).
        As transformers' interpolate_pos_encoding: the table itself when the grid has the table's number of patches
        and the image is square, else the patch part resized (bicubic, align_corners=False, in fp32, cast back)."""
        pos, p = self.position, self.cfg.patch_size
        n, dim = pos.shape[1] - 1, pos.shape[2]
        gh, gw = height // p, width // p
        if gh * gw == n and height == width:
            return pos
        side = int(n ** 0.5)
        grid = pos[:, 1:].reshape(1, side, side, dim).permute(0, 3, 1, 2)
        grid = F.interpolate(grid.to(torch.float32), size=(gh, gw), mode="bicubic", align_corners=False,
                             antialias=self.antialias).to(pos.dtype)
        return torch.cat([pos[:, :1], grid.permute(0, 2, 3, 1).reshape(1, gh * gw, dim)], dim=1)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """(batch, C, H, W) -> (batch * (1 + registers + patches), hidden), packed image by image."""
        b, c, hh, ww = pixel_values.shape
        p = self.cfg.patch_size
        gh, gw = hh // p, ww // p
        px = pixel_values[:, :, :gh * p, :gw * p]
        # (b, c, gh, p, gw, p) -> (b, gh, gw, c, p, p): each patch flattened in the conv weight's (c, kh, kw) order
        patches = px.reshape(b, c, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5).reshape(b * gh * gw, c * p * p)
        x = self.patch(patches).view(b, gh * gw, -1)
        x = torch.cat([self.cls_token.expand(b, 1, -1), x], dim=1) + self.positions(hh, ww)
        if self.registers is not None:
            x = torch.cat([x[:, :1], self.registers.expand(b, -1, -1), x[:, 1:]], dim=1)
        x = x.reshape(-1, x.shape[-1])
        drop = self.cfg.hidden_dropout_prob
        return F.dropout(x, drop, training=True) if self.training and drop > 0 else x


class SwiGLUFFN(nn.Module):
    """down_proj(silu(gate_proj(x)) * up_proj(x)): (tokens, hidden) -> (tokens, hidden), plain PyTorch math."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = Linear(hidden, intermediate)
        self.up_proj = Linear(hidden, intermediate)
        self.down_proj = Linear(intermediate, hidden)

    def forward(self, x: torch.Tensor, out_bias: bool = True) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x), with_bias=out_bias)


class Dinov2Layer(nn.Module):
    """h += ls1 * attn(attn_norm(h)); h += ls2 * mlp(mlp_norm(h)) (pre-norm; ls folded into Wo / the MLP's output
    projection when `folded`)."""

    def __init__(self, cfg: Dinov2Config):
        super().__init__()
        h = cfg.hidden_size
        self.attn_norm = LayerNorm(h, cfg.layer_norm_eps)
        self.attn = SelfAttention(h, cfg.num_attention_heads, bias=cfg.qkv_bias, out_bias=True,
                                  dropout=cfg.attention_probs_dropout_prob)
        self.ls1 = nn.Parameter(torch.full((h,), float(cfg.layerscale_value)))
        self.mlp_norm = LayerNorm(h, cfg.layer_norm_eps)
        self.mlp = (SwiGLUFFN(h, cfg.intermediate_size) if cfg.use_swiglu_ffn
                    else MLP(h, cfg.intermediate_size, cfg.hidden_act))
        self.ls2 = nn.Parameter(torch.full((h,), float(cfg.layerscale_value)))

    def out_projs(self) -> tuple[tuple[Linear, nn.Parameter], tuple[Linear, nn.Parameter]]:
        """((attn.Wo, ls1), (the MLP's output projection, ls2)): the linears layer scale folds into."""
        return (self.attn.Wo, self.ls1), (self.mlp.down_proj if isinstance(self.mlp, SwiGLUFFN) else self.mlp.fc2,
                                          self.ls2)

    def forward(self, h: torch.Tensor, delta, batch: PackedBatch, folded: bool):
        """h: the residual stream (tokens, hidden); delta: (y, bias), the previous block's output not yet added to h
        (fused into this block's attn_norm), or None. Returns (h, delta), this block's output left in delta."""
        (wo, ls1), (out, ls2) = self.out_projs()
        y, h = (self.attn_norm(h), h) if delta is None else self.attn_norm(delta[0], residual=h, input_bias=delta[1])
        a, bias = self.attn(y, batch.cu_seqlens, batch.max_seqlen, out_bias=False), wo.output_bias()
        if not folded:
            a, bias = a * ls1, bias * ls1
        y, h = self.mlp_norm(a, residual=h, input_bias=bias)
        m, bias = self.mlp(y, out_bias=False), out.output_bias()
        if not folded:
            m, bias = m * ls2, bias * ls2
        return h, (m, bias)


class Dinov2Model(QuantMixin, LoraMixin, SaveMixin, nn.Module):
    """The DINOv2 encoder: embeddings, pre-norm layer-scaled blocks, final LayerNorm. pool(hidden) = hidden[:, 0]
    (transformers' pooler_output: [CLS] after the final norm)."""
    task = "base"
    antialias = False  # the position interpolation's (transformers' dinov2: False)

    def __init__(self, config: Dinov2Config):
        super().__init__()
        self.config = config
        self.embeddings = Dinov2Embeddings(config, antialias=self.antialias)
        self.layers = nn.ModuleList(Dinov2Layer(config) for _ in range(config.num_hidden_layers))
        self.norm = LayerNorm(config.hidden_size, config.layer_norm_eps)
        self.pooler = None
        # Whether Wo and the MLP's output projections hold lambda * W, lambda * b (the form the weight map loads).
        self.layer_scale_folded = True

    # -- layer scale: folded for inference, unfolded for training ----------------------------------------------
    def train(self, mode: bool = True):
        """Train mode unfolds the layer scale (see the module docstring), eval mode folds it; a model whose weights
        fastenc.accelerate sets per call stays folded. Refuses drop_path_rate > 0 in training."""
        if mode and self.config.drop_path_rate > 0:
            raise ValueError(f"{type(self).__name__}.train(): drop_path_rate={self.config.drop_path_rate} (stochastic "
                             f"depth) is not supported in training; set config.drop_path_rate=0")
        unfold = mode and self.layer_scale_folded and not self.__dict__.get("params_from_hf", False)
        if unfold:
            for i, layer in enumerate(self.layers):
                for name, ls in (("ls1", layer.ls1), ("ls2", layer.ls2)):
                    if not bool((ls != 0).all()):
                        raise ValueError(f"{type(self).__name__}.train(): layers.{i}.{name} (layer scale lambda) has "
                                         f"zero channels, so the weights it is folded into cannot be unfolded for "
                                         f"training; load the model from transformers' weights with lambda != 0")
        out = super().train(mode)
        if unfold:
            self._rescale(fold=False)
        elif not mode and not self.layer_scale_folded:
            self._rescale(fold=True)
        return out

    def _rescale(self, fold: bool) -> None:
        """Multiply (fold) or divide (unfold) each block's Wo and MLP output weight rows and biases by lambda, in
        place (the same Parameter objects: an optimizer holding them keeps them)."""
        with torch.no_grad():
            for layer in self.layers:
                for linear, ls in layer.out_projs():
                    lam = ls.detach()
                    for t in (linear.weight, linear.bias):
                        f = lam.view(-1, *([1] * (t.dim() - 1))).to(t.dtype)
                        t.mul_(f) if fold else t.div_(f)
        self.layer_scale_folded = fold

    def save_pretrained(self, folder):
        """SaveMixin.save_pretrained (transformers' layout, lambda divided back out); a model in train mode (layer
        scale unfolded) is saved through a folded copy of its output projections, its own tensors untouched."""
        if self.layer_scale_folded:
            return super().save_pretrained(folder)
        swapped = []
        with torch.no_grad():
            for layer in self.layers:
                for linear, ls in layer.out_projs():
                    for attr in ("weight", "bias"):
                        t = linear._parameters[attr]
                        swapped.append((linear, attr, t))
                        linear._parameters[attr] = nn.Parameter(t * ls.view(-1, *([1] * (t.dim() - 1))),
                                                                requires_grad=t.requires_grad)
        try:
            return super().save_pretrained(folder)
        finally:
            for linear, attr, t in swapped:
                linear._parameters[attr] = t

    # -- forward ----------------------------------------------------------------------------------------------
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

    def _encode(self, pixel_values):
        """(x (images * tokens, hidden) after the final norm, PackedBatch); tokens = 1 + registers + patches."""
        pixel_values = self._check(pixel_values)
        b, _, hh, ww = pixel_values.shape
        p = self.config.patch_size
        s = 1 + self.config.num_register_tokens + (hh // p) * (ww // p)
        batch = PackedBatch(None, b, s, pixel_values.device)
        h = self.embeddings(pixel_values)
        delta = None
        folded = self.layer_scale_folded
        for layer in self.layers:
            h, delta = layer(h, delta, batch, folded)
        if delta is None:
            return self.norm(h), batch
        return self.norm(delta[0], residual=h, input_bias=delta[1], return_residual=False), batch

    def pool(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden[:, 0]: (batch, seq, hidden) -> (batch, hidden), transformers' pooler_output."""
        return hidden[:, 0]

    def pooler_output(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.pool(hidden)

    def forward(self, pixel_values, *, return_packed: bool = False):
        x, batch = self._encode(pixel_values)
        return (x, batch) if return_packed else batch.pad(x)


class Dinov2ForImageClassification(Dinov2Model):
    """logits = classifier([hidden[:, 0] ; mean(hidden[:, 1 + registers:])]) after the final norm: (batch,
    num_labels) (the (batch, 2 * hidden) features when num_labels == 0, as transformers' Identity head).
    labels= (batch,) int / float (see fastenc.models.losses) -> transformers' ImageClassifierOutput(loss, logits)."""
    task = "image_classification"

    def __init__(self, config: Dinov2Config):
        super().__init__(config)
        n = config.num_labels
        self.classifier = Linear(2 * config.hidden_size, n) if n > 0 else None

    def forward(self, pixel_values, labels=None, num_items_in_batch=None):
        kind = losses.check_image_labels(self, pixel_values, labels)
        x, batch = self._encode(pixel_values)
        tokens = x.view(batch.batch, batch.seq, -1)
        feats = torch.cat([tokens[:, 0], tokens[:, 1 + self.config.num_register_tokens:].mean(dim=1)], dim=1)
        logits = feats if self.classifier is None else self.classifier(feats)
        if labels is None:
            return logits
        loss = losses.sequence_loss(self.config, kind, logits, labels, num_items_in_batch)
        return losses.output(self.task, loss, logits)


def weight_map(cfg: Dinov2Config, task: str, prefix: str = "") -> list[Entry]:
    """fastenc name <-> transformers name of every DINOv2 tensor (prefix: "dinov2." inside the head class). Wo and
    the MLP's output projection are "scale" entries: (W or b, lambda) -> lambda * W (rows) / lambda * b."""
    p = prefix
    m: list[Entry] = [
        ("embeddings.cls_token", (f"{p}embeddings.cls_token",), "copy"),
        ("embeddings.position", (f"{p}embeddings.position_embeddings",), "copy"),
        ("embeddings.patch.weight", (f"{p}embeddings.patch_embeddings.projection.weight",), "patch"),
        ("embeddings.patch.bias", (f"{p}embeddings.patch_embeddings.projection.bias",), "copy"),
    ]
    if cfg.use_mask_token:
        m.append(("embeddings.mask_token", (f"{p}embeddings.mask_token",), "copy"))
    if cfg.num_register_tokens:
        m.append(("embeddings.registers", (f"{p}embeddings.register_tokens",), "copy"))
    for i in range(cfg.num_hidden_layers):
        f, h = f"layers.{i}", f"{p}encoder.layer.{i}"
        lam1, lam2 = f"{h}.layer_scale1.lambda1", f"{h}.layer_scale2.lambda1"
        m += lin(f"{f}.attn_norm", f"{h}.norm1")
        m += qkv(f"{f}.attn.Wqkv", tuple(f"{h}.attention.{n}_proj" for n in "qkv"), cfg.qkv_bias)
        m += [(f"{f}.attn.Wo.{t}", (f"{h}.attention.o_proj.{t}", lam1), "scale") for t in ("weight", "bias")]
        m.append((f"{f}.ls1", (lam1,), "copy"))
        m += lin(f"{f}.mlp_norm", f"{h}.norm2")
        if cfg.use_swiglu_ffn:
            m += lin(f"{f}.mlp.gate_proj", f"{h}.mlp.gate_proj")
            m += lin(f"{f}.mlp.up_proj", f"{h}.mlp.up_proj")
            out_fe, out_hf = f"{f}.mlp.down_proj", f"{h}.mlp.down_proj"
        else:
            m += lin(f"{f}.mlp.fc1", f"{h}.mlp.fc1")
            out_fe, out_hf = f"{f}.mlp.fc2", f"{h}.mlp.fc2"
        m += [(f"{out_fe}.{t}", (f"{out_hf}.{t}", lam2), "scale") for t in ("weight", "bias")]
        m.append((f"{f}.ls2", (lam2,), "copy"))
    m += lin("norm", f"{p}layernorm")
    if task == "image_classification" and cfg.num_labels > 0:
        m += lin("classifier", "classifier")
    return m


def legacy_names(head: str) -> tuple:
    """The checkpoint layout of the original DINOv2 weights, which transformers 5 still writes (its save_pretrained
    reverses its load-time conversion): encoder.layer.N.attention.attention.query, attention.output.dense,
    mlp.weights_in (SwiGLU gate and up stacked: split in two), mlp.weights_out -> the transformers-5 names."""
    layer = rf"^((?:{re.escape(head)})?encoder\.layer\.\d+\.)"
    return (
        (re.compile(layer + r"attention\.attention\.(query|key|value)\."),
         lambda mt: f"{mt[1]}attention.{mt[2][0]}_proj."),
        (re.compile(layer + r"attention\.output\.dense\."), lambda mt: f"{mt[1]}attention.o_proj."),
        (re.compile(layer + r"mlp\.weights_in\."), lambda mt: (f"{mt[1]}mlp.gate_proj.", f"{mt[1]}mlp.up_proj.")),
        (re.compile(layer + r"mlp\.weights_out\."), lambda mt: f"{mt[1]}mlp.down_proj."),
    )


def no_pooler(task: str, has_pooler: bool) -> dict:
    """DINOv2 has no pooler layer (its pooler_output is [CLS] after the final norm)."""
    return {"add_pooling_layer": False}


def tiny_config(task: str = "base", hidden: int = 36, heads: int = 3, layers: int = 2, image: int = 35,
                patch: int = 7, **kw):
    """A small transformers Dinov2Config for tests (Architecture.tiny_config): odd sizes by default."""
    import transformers

    return transformers.Dinov2Config(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                                     mlp_ratio=kw.pop("mlp_ratio", 3), image_size=image, patch_size=patch,
                                     attn_implementation="eager", **{"num_labels": 5, **kw})


ARCHITECTURE = Architecture(
    model_type="dinov2",
    config=Dinov2Config,
    heads=heads_of(Dinov2Model, Dinov2ForImageClassification),
    weight_map=weight_map,
    head_prefix="dinov2.",
    modality="vision",
    inputs=frozenset({"pixel_values", "return_dict", "num_items_in_batch"}),
    encoder_of=("Dinov2Backbone",),
    legacy_names=legacy_names("dinov2."),
    config_overrides=no_pooler,
    lora_targets=("q_proj", "v_proj"),
    pooling="cls",
    base_output="BaseModelOutputWithPooling",
    tiny_config=tiny_config,
)
