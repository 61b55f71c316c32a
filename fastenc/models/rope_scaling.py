"""RoPE parameters of a Hugging Face config (transformers 5.x `rope_parameters`, or the older `rope_theta` +
`rope_scaling`) and the cos/sin tables transformers computes from them (modeling_rope_utils: the default
inverse frequencies inv_freq_i = theta^(-2i/head_dim); "linear" divides them by `factor`; "dynamic" NTK rescales
theta only for sequences longer than max_position_embeddings, which the text models refuse, so its table is the
default one for every input they accept). Other scaling types (yarn, longrope, llama3, ...) are refused, naming
the config field."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch

SUPPORTED = ("default", "linear", "dynamic")


@dataclass(frozen=True)
class Rope:
    """theta: the base; kind: 'default' | 'linear' | 'dynamic'; factor: the scaling factor (1.0 for default)."""
    theta: float
    kind: str = "default"
    factor: float = 1.0

    def to_hf(self) -> dict:
        """The config.json `rope_parameters` entry transformers reads back."""
        out: dict[str, Any] = {"rope_type": self.kind, "rope_theta": self.theta}
        if self.kind != "default":
            out["factor"] = self.factor
        return out


def read_rope(name: str, d: Mapping[str, Any], default_theta: float) -> Rope:
    """The RoPE of config dict `d` (name: the config class, for errors). Reads rope_parameters (transformers 5.x),
    else rope_scaling + rope_theta (older configs; NomicBERT's rotary_emb_base)."""
    params = d.get("rope_parameters")
    field = "rope_parameters"
    if not params:
        params, field = d.get("rope_scaling") or {}, "rope_scaling"
    if not isinstance(params, Mapping):
        raise ValueError(f"{name}: {field} must be a dict, got {params!r}")
    theta = params.get("rope_theta", d.get("rope_theta", d.get("rotary_emb_base", default_theta)))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in SUPPORTED:
        raise ValueError(f"{name}: {field}['rope_type'] must be one of {', '.join(SUPPORTED)} (the RoPE scalings "
                         f"fastenc computes as transformers does), got {kind!r}")
    prf = params.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0)) or 1.0
    if float(prf) != 1.0:
        raise ValueError(f"{name}: {field}['partial_rotary_factor'] must be 1.0 (RoPE over the whole head), got "
                         f"{prf!r}")
    factor = float(params.get("factor", 1.0)) if kind != "default" else 1.0
    if not float(theta) > 0:
        raise ValueError(f"{name}: {field}['rope_theta'] must be > 0, got {theta!r}")
    if kind != "default" and not factor >= 1.0:
        raise ValueError(f"{name}: {field}['factor'] must be >= 1 for rope_type {kind!r}, got {factor!r}")
    return Rope(float(theta), kind, factor)


def rope_table(rope: Rope, head_dim: int, positions: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 cos, sin (positions, head_dim // 2) as transformers' rotary embedding computes them (positions 0..n-1
    times the fp32 inverse frequencies; linear scaling divides those by factor)."""
    if head_dim <= 0 or head_dim % 2:
        raise ValueError(f"rope_table: head_dim must be a positive even number, got {head_dim}")
    inv_freq = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float()
                                     / head_dim))
    if rope.kind == "linear":
        inv_freq = inv_freq / rope.factor
    t = torch.arange(positions, device=device, dtype=torch.int64).float()
    freqs = torch.outer(t, inv_freq)
    return freqs.cos(), freqs.sin()
