"""Explicit Hugging Face <-> fastenc weight maps (transformers 5.x names) and their inverse.

A map is a list of entries (fastenc_name, hf_names, kind):
  "copy"  one HF tensor is the fastenc tensor;
  "qkv"   three HF tensors (query, key, value) concatenated on dim 0 into the fused Wqkv (split back by chunk);
  "patch" the ViT conv weight (hidden, C, p, p) flattened to the patch GEMM's (hidden, C*p*p);
  "cat"   several HF tensors of equal shape concatenated on dim 0 (a gated MLP's gate and up projections into one
          [gate | up] Wi, in the order listed), split back in equal row blocks.
  "scale" two HF tensors (a linear's weight (out, in) or bias (out,), and a per-output-channel factor (out,)): the
          fastenc tensor is their product, factor on the rows (DINOv2's layer scale folded into the projection it
          follows); the inverse divides the factor back out (the factor has its own "copy" entry).
Each architecture's map is declared in its own model file (fastenc.models.architecture); `lin` and `qkv` build
its entries. Legacy checkpoint names (LayerNorm gamma/beta, and each architecture's legacy_names such as ViT's
encoder.layer.N.attention.attention.query) are renamed to the transformers-5 names by `normalize_hf_names`
before the map is applied (a rule may also split a stacked tensor, as DINOv2's SwiGLU mlp.weights_in), and the
architecture's legacy_fused tensors (the layout transformers' save_pretrained still writes for GTE, NomicBERT and
Jina-v3: fused q/k/v, [up | gate]) split into theirs (`unfuse`).
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
        items = [(k, v)]
        for pat, rep in rules:
            items = [renamed for key, t in items for renamed in _rename(pat, rep, key, t)]
        out.update(items)
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


def _rename(pat, rep, key: str, t):
    """[(name, tensor)] after one legacy rule. A replacement function may return a tuple of names: the tensor is then
    split in that many equal parts on dim 0, one per name (DINOv2's mlp.weights_in -> gate_proj, up_proj); t may be
    None (a name alone)."""
    mt = pat.search(key) if callable(rep) else None
    new = rep(mt) if mt is not None else None
    if not isinstance(new, tuple):
        return [(pat.sub(rep, key), t)]
    parts = t.chunk(len(new), dim=0) if t is not None else (None,) * len(new)
    return [(key[:mt.start()] + name + key[mt.end():], part) for name, part in zip(new, parts)]


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
        elif kind == "scale":
            out[fe] = scaled(hs, ts[0], ts[1])
        else:
            raise ValueError(f"unknown weight-map kind {kind!r}")
    return out


def cat(fe: str, hf: tuple[str, ...], bias: bool = True) -> list[Entry]:
    """Entries fusing the HF linears `hf` (equal shapes) into one fastenc linear, rows in that order."""
    out = [(f"{fe}.weight", tuple(f"{h}.weight" for h in hf), "cat")]
    if bias:
        out.append((f"{fe}.bias", tuple(f"{h}.bias" for h in hf), "cat"))
    return out


def scaled(hs, t: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """t * factor on t's rows: t (out, ...) and factor (out,) (a "scale" entry's two HF tensors, named hs)."""
    if factor.dim() != 1 or factor.shape[0] != t.shape[0]:
        raise ValueError(f"weight {hs[1]} must have shape ({t.shape[0]},) to scale {hs[0]}, got {tuple(factor.shape)}")
    return t * factor.view(-1, *([1] * (t.dim() - 1))).to(t.dtype)


def _qkv_part_shape(fe: str, cfg, ts) -> tuple[int, ...]:
    """The shape each of query, key and value must have: (hidden, hidden) weights, (hidden,) biases."""
    hidden = getattr(cfg, "hidden_size", None) or ts[-1].shape[0]
    return (hidden,) if fe.endswith(".bias") else (hidden, hidden)


def fastenc_to_hf(entries: Iterable[Entry], state: Mapping[str, torch.Tensor], cfg=None) -> dict[str, torch.Tensor]:
    """The inverse map: fastenc state dict -> HF state dict (Wqkv split in three, patch weight back to conv shape,
    a "scale" entry divided by its factor, which its own "copy" entry writes)."""
    out = {}
    entries = list(entries)
    for fe, hs, kind in sorted(entries, key=lambda e: e[2] == "scale"):  # (the factors first)
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
        elif kind == "scale":
            out[hs[0]] = t / out[hs[1]].view(-1, *([1] * (t.dim() - 1))).to(t.dtype)
        else:
            raise ValueError(f"unknown weight-map kind {kind!r}")
    return out
