"""Explicit Hugging Face <-> fastenc weight maps (transformers 5.x names) and their inverse.

A map is a list of entries (fastenc_name, hf_names, kind):
  "copy"  one HF tensor is the fastenc tensor;
  "qkv"   three HF tensors (query, key, value) concatenated on dim 0 into the fused Wqkv (split back by chunk);
  "patch" the ViT conv weight (hidden, C, p, p) flattened to the patch GEMM's (hidden, C*p*p);
  "cat"   several HF tensors of equal shape concatenated on dim 0 (a gated MLP's gate and up projections into one
          [gate | up] Wi, in the order listed), split back in equal row blocks.
Each architecture's map is declared in its own model file (fastenc.models.architecture); `lin` and `qkv` build
its entries. Legacy checkpoint names (LayerNorm gamma/beta, and each architecture's legacy_names such as ViT's
encoder.layer.N.attention.attention.query) are renamed to the transformers-5 names by `normalize_hf_names`
before the map is applied, and the architecture's legacy_fused tensors (the layout transformers' save_pretrained
still writes for GTE, NomicBERT and Jina-v3: fused q/k/v, [up | gate]) split into theirs (`unfuse`).
"""
from __future__ import annotations

import re
from typing import Iterable, Mapping

import torch

Entry = tuple[str, tuple[str, ...], str]


def lin(fe: str, hf: str, bias: bool = True) -> list[Entry]:
    out = [(f"{fe}.weight", (f"{hf}.weight",), "copy")]
    if bias:
        out.append((f"{fe}.bias", (f"{hf}.bias",), "copy"))
    return out


def qkv(fe: str, hf: tuple[str, str, str], bias: bool = True) -> list[Entry]:
    out = [(f"{fe}.weight", tuple(f"{h}.weight" for h in hf), "qkv")]
    if bias:
        out.append((f"{fe}.bias", tuple(f"{h}.bias" for h in hf), "qkv"))
    return out


_LEGACY_ANY = [  # (pattern, replacement): older checkpoint names -> transformers 5.x names, every architecture
    (re.compile(r"\.gamma$"), ".weight"),
    (re.compile(r"\.beta$"), ".bias"),
]


def normalize_hf_names(arch: str, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename legacy checkpoint keys to transformers-5 names (LayerNorm gamma/beta; the architecture's own
    legacy_names, e.g. the old ViT layout)."""
    from fastenc.models.architecture import get

    out = {}
    spec = get(arch)
    rules = _LEGACY_ANY + list(spec.legacy_names)
    for k, v in state.items():
        for pat, rep in rules:
            k = pat.sub(rep, k)
        out[k] = v
    return unfuse(out, spec.legacy_fused) if spec.legacy_fused else out


def unfuse(state: Mapping[str, torch.Tensor], rules) -> dict[str, torch.Tensor]:
    """Split fused checkpoint tensors into the transformers-5 tensors they hold, in equal row blocks: rules are
    (regex with groups (module, leaf), (part names...)); a key `<module>.<fused>.<leaf>` matching one becomes
    `<module>.<part>.<leaf>` for each part, in order (GTE's qkv_proj -> q_proj, k_proj, v_proj; its up_gate_proj,
    [up | gate], -> up_proj, gate_proj). A tensor whose rows do not split evenly is an error naming it."""
    out = {}
    for k, v in state.items():
        for pat, parts in rules:
            m = re.fullmatch(pat, k)
            if m is None or v is None:  # (a name without a tensor, e.g. a PEFT target's, keeps its fused name)
                continue
            if v.shape[0] % len(parts):
                raise ValueError(f"weight {k} must have a multiple of {len(parts)} rows ({', '.join(parts)}), got "
                                 f"shape {tuple(v.shape)}")
            for part, t in zip(parts, v.chunk(len(parts), dim=0)):
                out[f"{m.group(1)}.{part}.{m.group(2)}"] = t
            break
        else:
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
        elif kind == "cat":
            bad = [(h, tuple(t.shape)) for h, t in zip(hs, ts) if t.shape != ts[0].shape]
            if bad:
                raise ValueError(f"weights {list(hs)} must have one shape {tuple(ts[0].shape)}, got {bad}")
            out[fe] = torch.cat(ts, dim=0)
        else:
            raise ValueError(f"unknown weight-map kind {kind!r}")
    return out


def cat(fe: str, hf: tuple[str, ...], bias: bool = True) -> list[Entry]:
    """Entries fusing the HF linears `hf` (equal shapes) into one fastenc linear, rows in that order."""
    out = [(f"{fe}.weight", tuple(f"{h}.weight" for h in hf), "cat")]
    if bias:
        out.append((f"{fe}.bias", tuple(f"{h}.bias" for h in hf), "cat"))
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
        elif kind == "cat":
            for h, part in zip(hs, t.chunk(len(hs), dim=0)):
                out[h] = part
        else:
            raise ValueError(f"unknown weight-map kind {kind!r}")
    return out
