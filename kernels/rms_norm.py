"""Triton RMSNorm forward (+ fused residual add): the LayerNorm kernel of layer_norm.py with IS_RMS=True.

y = h * rsqrt(mean(h^2) + eps) * w, h = x (+ residual); fp32 math (Zhang & Sennrich 2019).
"""
from __future__ import annotations

import torch

from fastenc.kernels.layer_norm import _launch, _norm_fwd_kernel, norm_config


def rms_norm_fwd(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None, eps: float, *,
                 out: torch.Tensor | None = None, residual_out: torch.Tensor | None = None):
    """x, residual: (rows, hidden) with unit column stride, fp32/fp16/bf16; weight: (hidden,) contiguous.

    Returns (y, x + residual) or (y, None), both (rows, hidden) in x's dtype (into `out` / `residual_out`
    when given).
    """
    return _launch(x, weight, None, residual, eps, True, out, residual_out)


def compile_specs() -> list[dict]:
    """RMSNorm configurations of the shared kernel (the LayerNorm module compiles the others)."""
    specs = []
    for name, dt, hidden, res in (("rms_fp16_768", "fp16", 768, False), ("rms_fp32_1000_res", "fp32", 1000, True)):
        cfg = norm_config(hidden)
        p = "*" + dt
        specs.append({
            "name": name, "fn": _norm_fwd_kernel,
            "signature": {"X": p, "R": p, "W": p, "B": p, "Y": p, "H": p, "M": "i32", "N": "i32",
                          "stride_x": "i32", "stride_r": "i32", "stride_y": "i32", "stride_h": "i32",
                          "eps": "fp32", "HAS_RES": "constexpr", "HAS_BIAS": "constexpr", "IS_RMS": "constexpr",
                          "BLOCK_N": "constexpr", "ROWS": "constexpr", "ONE_PASS": "constexpr"},
            "constexprs": {"HAS_RES": res, "HAS_BIAS": False, "IS_RMS": True, "BLOCK_N": cfg["BLOCK_N"],
                           "ROWS": cfg["ROWS"], "ONE_PASS": cfg["ONE_PASS"]},
            "divisible_by_16": ["N", "stride_x", "stride_r", "stride_y", "stride_h"] if hidden % 16 == 0 else [],
            "num_warps": cfg["num_warps"], "num_stages": 1,
        })
    return specs
