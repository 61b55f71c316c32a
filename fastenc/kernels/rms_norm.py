"""Triton RMSNorm forward (+ fused residual add): the LayerNorm kernel of layer_norm.py with IS_RMS=True.

y = h * rsqrt(mean(h^2) + eps) * w, h = x (+ residual); fp32 math (Zhang & Sennrich 2019).
"""
from __future__ import annotations

import torch

from fastenc.kernels.layer_norm import _launch, norm_compile_spec


def rms_norm_fwd(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None, eps: float, *,
                 out: torch.Tensor | None = None, residual_out: torch.Tensor | None = None, stats: bool = False):
    """x, residual: (rows, hidden) with unit column stride, fp32/fp16/bf16; weight: (hidden,) contiguous.

    Returns (y, x + residual) or (y, None), both (rows, hidden) in x's dtype (into `out` / `residual_out`
    when given). stats=True (training) returns (y, h, None, rstd) with rstd (rows,) fp32.
    """
    return _launch(x, weight, None, residual, eps, True, out, residual_out, stats)


def compile_specs() -> list[dict]:
    """RMSNorm configurations of the shared kernel (the LayerNorm module compiles the others)."""
    return [norm_compile_spec(name, dt, hidden, res, False, True)
            for name, dt, hidden, res in (("rms_fp16_768", "fp16", 768, False), ("rms_fp32_1000_res", "fp32", 1000, True))
            ] + [norm_compile_spec("rms_bf16_4096_res_stats", "bf16", 4096, True, False, True, stats=True)]
