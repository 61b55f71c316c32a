"""Triton GeGLU forward with ModernBERT's order: input, gate = x.chunk(2, -1); out = gelu(input) * gate.

GLU variants: Shazeer 2020, "GLU Variants Improve Transformer". One read of each half, one write of out.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from fastenc.kernels._util import on_device
from fastenc.kernels.gelu import _gelu_f32, _gelu_grad_f32, approx_code, tile_config


@triton.jit
def _geglu_fwd_kernel(X, Y, M, N, stride_x, stride_y, APPROX: tl.constexpr, ROWS: tl.constexpr,
                      BLOCK_N: tl.constexpr):
    # x row = [input (N) | gate (N)];  y[r, c] = gelu(x[r, c]) * x[r, N + c]   (fp32 math, gelu as in gelu.py)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    mask = (rows < M) & (cols < N)
    base = X + rows.to(tl.int64) * stride_x + cols
    a = tl.load(base, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(base + N, mask=mask, other=0.0).to(tl.float32)
    y = _gelu_f32(a, APPROX) * g
    tl.store(Y + rows.to(tl.int64) * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _geglu_bwd_kernel(G, X, DX, M, N, stride_g, stride_x, stride_dx, APPROX: tl.constexpr, ROWS: tl.constexpr,
                      BLOCK_N: tl.constexpr):
    # x row = [a (N) | gate (N)], out = gelu(a) * gate; recomputed from x (fp32 math):
    #   dx[r, c]     = g[r, c] * gate[r, c] * gelu'(a[r, c])      (d input)
    #   dx[r, N + c] = g[r, c] * gelu(a[r, c])                    (d gate)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    mask = (rows < M) & (cols < N)
    rows64 = rows.to(tl.int64)
    base = X + rows64 * stride_x + cols
    a = tl.load(base, mask=mask, other=0.0).to(tl.float32)
    gate = tl.load(base + N, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(G + rows64 * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    da = g * gate * _gelu_grad_f32(a, APPROX)
    dg = g * _gelu_f32(a, APPROX)
    dst = DX + rows64 * stride_dx + cols
    tl.store(dst, da.to(DX.dtype.element_ty), mask=mask)
    tl.store(dst + N, dg.to(DX.dtype.element_ty), mask=mask)


def geglu_fwd(x: torch.Tensor, approximate: str, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """x: (rows, 2n) with unit column stride, fp32/fp16/bf16 -> (rows, n) in x's dtype (into `out` when given)."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    m, n2 = x.shape
    n = n2 // 2
    y = torch.empty((m, n), dtype=x.dtype, device=x.device) if out is None else out
    if m == 0 or n == 0:
        return y
    cfg = tile_config(n)
    grid = (triton.cdiv(m, cfg["ROWS"]), triton.cdiv(n, cfg["BLOCK_N"]))
    with on_device(x):
        _geglu_fwd_kernel[grid](x, y, m, n, x.stride(0), y.stride(0), APPROX=approx_code(approximate),
                                ROWS=cfg["ROWS"], BLOCK_N=cfg["BLOCK_N"], num_warps=cfg["num_warps"])
    return y


def geglu_out(x: torch.Tensor, approximate: str, out: torch.Tensor) -> None:
    """geglu_fwd into `out` ((rows, n), unit column stride; may be x[:, :n])."""
    geglu_fwd(x, approximate, out=out)


def geglu_bwd(grad: torch.Tensor, x: torch.Tensor, approximate: str) -> torch.Tensor:
    """grad: (rows, n), x: (rows, 2n) fp32/fp16/bf16 (unit column stride) -> dx (rows, 2n) = [d input | d gate]."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    grad = grad if grad.stride(-1) == 1 else grad.contiguous()
    m, n2 = x.shape
    n = n2 // 2
    dx = torch.empty((m, n2), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return dx
    cfg = tile_config(n)
    grid = (triton.cdiv(m, cfg["ROWS"]), triton.cdiv(n, cfg["BLOCK_N"]))
    with on_device(x):
        _geglu_bwd_kernel[grid](grad, x, dx, m, n, grad.stride(0), x.stride(0), dx.stride(0),
                                APPROX=approx_code(approximate), ROWS=cfg["ROWS"], BLOCK_N=cfg["BLOCK_N"],
                                num_warps=cfg["num_warps"])
    return dx


def compile_specs() -> list[dict]:
    specs = []
    # ModernBERT-base intermediate 1152, -large 2624; a tanh and a quick variant.
    for name, dt, n, approx in (("geglu_bf16_1152_erf", "bf16", 1152, 0), ("geglu_fp16_2624_erf", "fp16", 2624, 0),
                                ("geglu_fp32_1000_tanh", "fp32", 1000, 1), ("geglu_bf16_1152_quick", "bf16", 1152, 2)):
        cfg = tile_config(n)
        p = "*" + dt
        specs.append({
            "name": name, "fn": _geglu_fwd_kernel,
            "signature": {"X": p, "Y": p, "M": "i32", "N": "i32", "stride_x": "i32", "stride_y": "i32",
                          "APPROX": "constexpr", "ROWS": "constexpr", "BLOCK_N": "constexpr"},
            "constexprs": {"APPROX": approx, "ROWS": cfg["ROWS"], "BLOCK_N": cfg["BLOCK_N"]},
            "divisible_by_16": ["N", "stride_x", "stride_y"] if n % 16 == 0 else [],
            "num_warps": cfg["num_warps"], "num_stages": 1,
        })
    for name, dt, n, approx in (("geglu_bwd_bf16_1152_erf", "bf16", 1152, 0),
                                ("geglu_bwd_fp32_1000_tanh", "fp32", 1000, 1),
                                ("geglu_bwd_fp16_1152_quick", "fp16", 1152, 2)):
        cfg = tile_config(n)
        p = "*" + dt
        specs.append({
            "name": name, "fn": _geglu_bwd_kernel,
            "signature": {"G": p, "X": p, "DX": p, "M": "i32", "N": "i32", "stride_g": "i32", "stride_x": "i32",
                          "stride_dx": "i32", "APPROX": "constexpr", "ROWS": "constexpr", "BLOCK_N": "constexpr"},
            "constexprs": {"APPROX": approx, "ROWS": cfg["ROWS"], "BLOCK_N": cfg["BLOCK_N"]},
            "divisible_by_16": ["N", "stride_g", "stride_x", "stride_dx"] if n % 16 == 0 else [],
            "num_warps": cfg["num_warps"], "num_stages": 1,
        })
    return specs
