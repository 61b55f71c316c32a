"""Explicit Hugging Face <-> fastenc weight maps (transformers 5.x names) and their inverse.

A map is a list of entries (fastenc_name, hf_names, kind):
  "copy"  one HF tensor is the fastenc tensor;
  "qkv"   three HF tensors (query, key, value) concatenated on dim 0 into the fused Wqkv (split back by chunk);
  "patch" the ViT conv weight (hidden, C, p, p) flattened to the patch GEMM's (hidden, C*p*p).
Legacy checkpoint names (ViT's encoder.layer.N.attention.attention.query, LayerNorm gamma/beta) are renamed to
the transformers-5 names by `normalize_hf_names` before the map is applied.
"""
from __future__ import annotations

import re
from typing import Iterable, Mapping

import torch

Entry = tuple[str, tuple[str, ...], str]


def _lin(fe: str, hf: str, bias: bool = True) -> list[Entry]:
    out = [(f"{fe}.weight", (f"{hf}.weight",), "copy")]
    if bias:
        out.append((f"{fe}.bias", (f"{hf}.bias",), "copy"))
    return out


def _qkv(fe: str, hf: tuple[str, str, str], bias: bool = True) -> list[Entry]:
    out = [(f"{fe}.weight", tuple(f"{h}.weight" for h in hf), "qkv")]
    if bias:
        out.append((f"{fe}.bias", tuple(f"{h}.bias" for h in hf), "qkv"))
    return out


def bert_map(cfg, task: str, prefix: str = "") -> list[Entry]:
    p = prefix
    m: list[Entry] = [
        ("embeddings.word.weight", (f"{p}embeddings.word_embeddings.weight",), "copy"),
        ("embeddings.position.weight", (f"{p}embeddings.position_embeddings.weight",), "copy"),
        ("embeddings.token_type.weight", (f"{p}embeddings.token_type_embeddings.weight",), "copy"),
        *_lin("embeddings.norm", f"{p}embeddings.LayerNorm"),
    ]
    for i in range(cfg.num_hidden_layers):
        f, h = f"layers.{i}", f"{p}encoder.layer.{i}"
        m += _qkv(f"{f}.attn.Wqkv", tuple(f"{h}.attention.self.{n}" for n in ("query", "key", "value")))
        m += _lin(f"{f}.attn.Wo", f"{h}.attention.output.dense")
        m += _lin(f"{f}.attn_norm", f"{h}.attention.output.LayerNorm")
        m += _lin(f"{f}.mlp.fc1", f"{h}.intermediate.dense")
        m += _lin(f"{f}.mlp.fc2", f"{h}.output.dense")
        m += _lin(f"{f}.mlp_norm", f"{h}.output.LayerNorm")
    if cfg.add_pooling_layer:
        m += _lin("pooler", f"{p}pooler.dense")
    if task in ("sequence_classification", "token_classification"):
        m += _lin("classifier", "classifier")
    return m


def modernbert_map(cfg, task: str, prefix: str = "") -> list[Entry]:
    p, nb = prefix, cfg.norm_bias
    m: list[Entry] = [("embeddings.tok.weight", (f"{p}embeddings.tok_embeddings.weight",), "copy"),
                      *_lin("embeddings.norm", f"{p}embeddings.norm", nb)]
    for i in range(cfg.num_hidden_layers):
        f, h = f"layers.{i}", f"{p}layers.{i}"
        if i > 0:
            m += _lin(f"{f}.attn_norm", f"{h}.attn_norm", nb)
        m += _lin(f"{f}.attn.Wqkv", f"{h}.attn.Wqkv", cfg.attention_bias)
        m += _lin(f"{f}.attn.Wo", f"{h}.attn.Wo", cfg.attention_bias)
        m += _lin(f"{f}.mlp_norm", f"{h}.mlp_norm", nb)
        m += _lin(f"{f}.mlp.Wi", f"{h}.mlp.Wi", cfg.mlp_bias)
        m += _lin(f"{f}.mlp.Wo", f"{h}.mlp.Wo", cfg.mlp_bias)
    m += _lin("final_norm", f"{p}final_norm", nb)
    if task in ("sequence_classification", "token_classification"):
        m += _lin("head.dense", "head.dense", cfg.classifier_bias)
        m += _lin("head.norm", "head.norm", nb)
        m += _lin("classifier", "classifier")
    return m


def vit_map(cfg, task: str, prefix: str = "") -> list[Entry]:
    p = prefix
    m: list[Entry] = [
        ("embeddings.cls_token", (f"{p}embeddings.cls_token",), "copy"),
        ("embeddings.position", (f"{p}embeddings.position_embeddings",), "copy"),
        ("embeddings.patch.weight", (f"{p}embeddings.patch_embeddings.projection.weight",), "patch"),
        ("embeddings.patch.bias", (f"{p}embeddings.patch_embeddings.projection.bias",), "copy"),
    ]
    for i in range(cfg.num_hidden_layers):
        f, h = f"layers.{i}", f"{p}layers.{i}"
        m += _lin(f"{f}.attn_norm", f"{h}.layernorm_before")
        m += _qkv(f"{f}.attn.Wqkv", tuple(f"{h}.attention.{n}_proj" for n in "qkv"), cfg.qkv_bias)
        m += _lin(f"{f}.attn.Wo", f"{h}.attention.o_proj")
        m += _lin(f"{f}.mlp_norm", f"{h}.layernorm_after")
        m += _lin(f"{f}.mlp.fc1", f"{h}.mlp.fc1")
        m += _lin(f"{f}.mlp.fc2", f"{h}.mlp.fc2")
    m += _lin("norm", f"{p}layernorm")
    if cfg.add_pooling_layer:
        m += _lin("pooler", f"{p}pooler.dense")
    if task == "image_classification" and cfg.num_labels > 0:
        m += _lin("classifier", "classifier")
    return m


MAPS = {"bert": bert_map, "modernbert": modernbert_map, "vit": vit_map}
# Prefix of the encoder inside each Hugging Face head class.
HEAD_PREFIX = {"bert": "bert.", "modernbert": "model.", "vit": "vit."}

_LEGACY_ANY = [  # (pattern, replacement): older checkpoint names -> transformers 5.x names, every architecture
    (re.compile(r"\.gamma$"), ".weight"),
    (re.compile(r"\.beta$"), ".bias"),
]
_LEGACY_VIT = [  # ViT before transformers 5 (encoder.layer.N.attention.attention.query ...)
    (re.compile(r"^(vit\.)?encoder\.layer\.(\d+)\.attention\.attention\.(query|key|value)\."),
     lambda mt: f"{mt[1] or ''}layers.{mt[2]}.attention.{mt[3][0]}_proj."),
    (re.compile(r"^(vit\.)?encoder\.layer\.(\d+)\.attention\.output\.dense\."),
     lambda mt: f"{mt[1] or ''}layers.{mt[2]}.attention.o_proj."),
    (re.compile(r"^(vit\.)?encoder\.layer\.(\d+)\.intermediate\.dense\."), lambda mt: f"{mt[1] or ''}layers.{mt[2]}.mlp.fc1."),
    (re.compile(r"^(vit\.)?encoder\.layer\.(\d+)\.output\.dense\."), lambda mt: f"{mt[1] or ''}layers.{mt[2]}.mlp.fc2."),
    (re.compile(r"^(vit\.)?encoder\.layer\.(\d+)\.(layernorm_before|layernorm_after)\."),
     lambda mt: f"{mt[1] or ''}layers.{mt[2]}.{mt[3]}."),
]


def normalize_hf_names(arch: str, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename legacy checkpoint keys to transformers-5 names (LayerNorm gamma/beta; old ViT layout)."""
    out = {}
    rules = _LEGACY_ANY + (_LEGACY_VIT if arch == "vit" else [])
    for k, v in state.items():
        for pat, rep in rules:
            k = pat.sub(rep, k)
        out[k] = v
    return out


def hf_to_fastenc(entries: Iterable[Entry], hf_state: Mapping[str, torch.Tensor], cfg=None) -> dict[str, torch.Tensor]:
    """Apply a map: HF state dict -> fastenc state dict. Raises KeyError listing every missing HF name."""
    entries = list(entries)
    missing = [h for _, hs, _ in entries for h in hs if h not in hf_state]
    if missing:
        raise KeyError(f"missing weights: {missing[:8]}{' ...' if len(missing) > 8 else ''} ({len(missing)} in all)")
    out = {}
    for fe, hs, kind in entries:
        ts = [hf_state[h] for h in hs]
        if kind == "copy":
            out[fe] = ts[0]
        elif kind == "qkv":
            for h, t in zip(hs, ts):  # q, k and v: each (hidden, hidden) or (hidden,)
                want = _qkv_part_shape(fe, cfg, ts)
                if tuple(t.shape) != want:
                    raise ValueError(f"weight {h} must have shape {want}, got {tuple(t.shape)}")
            out[fe] = torch.cat(ts, dim=0)
        elif kind == "patch":
            out[fe] = ts[0].reshape(ts[0].shape[0], -1)
        else:
            raise ValueError(f"unknown weight-map kind {kind!r}")
    return out


def _qkv_part_shape(fe: str, cfg, ts) -> tuple[int, ...]:
    """The shape each of query, key and value must have: (hidden, hidden) weights, (hidden,) biases."""
    hidden = getattr(cfg, "hidden_size", None) or ts[-1].shape[0]
    return (hidden,) if fe.endswith(".bias") else (hidden, hidden)


def fastenc_to_hf(entries: Iterable[Entry], state: Mapping[str, torch.Tensor], cfg=None) -> dict[str, torch.Tensor]:
    """The inverse map: fastenc state dict -> HF state dict (Wqkv split in three, patch weight back to conv shape)."""
    out = {}
    for fe, hs, kind in entries:
        t = state[fe]
        if kind == "copy":
            out[hs[0]] = t
        elif kind == "qkv":
            for h, part in zip(hs, t.chunk(3, dim=0)):
                out[h] = part
        elif kind == "patch":
            c, p = cfg.num_channels, cfg.patch_size
            out[hs[0]] = t.reshape(t.shape[0], c, p, p)
        else:
            raise ValueError(f"unknown weight-map kind {kind!r}")
    return out
