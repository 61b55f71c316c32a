"""Triton SwiGLU forward and backward: out = silu(gate) * up, gate and up row-strided views (the two halves of one
fused (rows, 2N) input [gate | up], or two (rows, N) tensors).

GLU variants: Shazeer 2020, "GLU Variants Improve Transformer". One read of each input, one write of out.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from fastenc.kernels._util import on_device
from fastenc.kernels.gelu import _x_sigmoid_f32, _x_sigmoid_grad_f32, tile_config


@triton.jit
def _swiglu_fwd_kernel(G, U, Y, M, N, stride_g, stride_u, stride_y, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    # y[r, c] = silu(gate[r, c]) * up[r, c],  silu(g) = g * sigmoid(g) = g / (1 + exp(-g))   (fp32 math)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    mask = (rows < M) & (cols < N)
    rows64 = rows.to(tl.int64)
    g = tl.load(G + rows64 * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U + rows64 * stride_u + cols, mask=mask, other=0.0).to(tl.float32)
    y = _x_sigmoid_f32(g, 1.0) * u
    tl.store(Y + rows64 * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd_kernel(DY, G, U, DG, DU, M, N, stride_dy, stride_g, stride_u, stride_d, ROWS: tl.constexpr,
                       BLOCK_N: tl.constexpr):
    # out = silu(gate) * up; recomputed from gate and up (fp32 math), s = sigmoid(gate):
    #   dgate[r, c] = dy[r, c] * up[r, c] * silu'(gate[r, c]),  silu'(g) = s + g s (1 - s)
    #   dup[r, c]   = dy[r, c] * silu(gate[r, c])
    # DG and DU share the row stride stride_d (the two halves of one (rows, 2N) gradient, or two (rows, N) ones).
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    mask = (rows < M) & (cols < N)
    rows64 = rows.to(tl.int64)
    g = tl.load(G + rows64 * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U + rows64 * stride_u + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + rows64 * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
    dg = dy * u * _x_sigmoid_grad_f32(g, 1.0)
    du = dy * _x_sigmoid_f32(g, 1.0)
    tl.store(DG + rows64 * stride_d + cols, dg.to(DG.dtype.element_ty), mask=mask)
    tl.store(DU + rows64 * stride_d + cols, du.to(DU.dtype.element_ty), mask=mask)


def _halves(x: torch.Tensor, up: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate, up) views with unit column stride: the halves of x (rows, 2n) when up is None, else x and up."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    if up is None:
        n = x.shape[1] // 2
        return x[:, :n], x[:, n:]
    return x, (up if up.stride(-1) == 1 else up.contiguous())


def swiglu_fwd(x: torch.Tensor, up: torch.Tensor | None = None, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """x: (rows, 2n) = [gate | up] with up None, or gate x (rows, n) and up (rows, n); fp32/fp16/bf16, unit column
    stride -> silu(gate) * up, (rows, n) in x's dtype (into `out`, unit column stride, when given)."""
    gate, u = _halves(x, up)
    m, n = gate.shape
    y = torch.empty((m, n), dtype=x.dtype, device=x.device) if out is None else out
    if m == 0 or n == 0:
        return y
    cfg = tile_config(n)
    grid = (triton.cdiv(m, cfg["ROWS"]), triton.cdiv(n, cfg["BLOCK_N"]))
    with on_device(x):
        _swiglu_fwd_kernel[grid](gate, u, y, m, n, gate.stride(0), u.stride(0), y.stride(0), ROWS=cfg["ROWS"],
                                 BLOCK_N=cfg["BLOCK_N"], num_warps=cfg["num_warps"])
    return y


def swiglu_bwd(grad: torch.Tensor, x: torch.Tensor, up: torch.Tensor | None = None):
    """grad: (rows, n); fused x (rows, 2n) -> (dx (rows, 2n) = [d gate | d up], empty); gate x and up (rows, n) ->
    (d gate, d up), each (rows, n). In x's dtype."""
    gate, u = _halves(x, up)
    grad = grad if grad.stride(-1) == 1 else grad.contiguous()
    m, n = gate.shape
    if up is None:
        dx = torch.empty((m, 2 * n), dtype=x.dtype, device=x.device)
        dg, du, rest = dx[:, :n], dx[:, n:], x.new_empty(0)
    else:
        dg, du = torch.empty((m, n), dtype=x.dtype, device=x.device), torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m and n:
        cfg = tile_config(n)
        grid = (triton.cdiv(m, cfg["ROWS"]), triton.cdiv(n, cfg["BLOCK_N"]))
        with on_device(x):
            _swiglu_bwd_kernel[grid](grad, gate, u, dg, du, m, n, grad.stride(0), gate.stride(0), u.stride(0),
                                     dg.stride(0), ROWS=cfg["ROWS"], BLOCK_N=cfg["BLOCK_N"],
                                     num_warps=cfg["num_warps"])
    return (dx, rest) if up is None else (dg, du)


def compile_specs() -> list[dict]:
    specs = []
    # LLaMA-style intermediate sizes: 1152 (fused halves: row stride 2n), 2752; an odd 1000.
    for name, dt, n in (("swiglu_bf16_1152", "bf16", 1152), ("swiglu_fp16_2752", "fp16", 2752),
                        ("swiglu_fp32_1000", "fp32", 1000)):
        cfg = tile_config(n)
        p = "*" + dt
        specs.append({
            "name": name, "fn": _swiglu_fwd_kernel,
            "signature": {"G": p, "U": p, "Y": p, "M": "i32", "N": "i32", "stride_g": "i32", "stride_u": "i32",
                          "stride_y": "i32", "ROWS": "constexpr", "BLOCK_N": "constexpr"},
            "constexprs": {"ROWS": cfg["ROWS"], "BLOCK_N": cfg["BLOCK_N"]},
            "divisible_by_16": ["N", "stride_g", "stride_u", "stride_y"] if n % 16 == 0 else [],
            "num_warps": cfg["num_warps"], "num_stages": 1,
        })
    for name, dt, n in (("swiglu_bwd_bf16_1152", "bf16", 1152), ("swiglu_bwd_fp32_1000", "fp32", 1000)):
        cfg = tile_config(n)
        p = "*" + dt
        specs.append({
            "name": name, "fn": _swiglu_bwd_kernel,
            "signature": {"DY": p, "G": p, "U": p, "DG": p, "DU": p, "M": "i32", "N": "i32", "stride_dy": "i32",
                          "stride_g": "i32", "stride_u": "i32", "stride_d": "i32", "ROWS": "constexpr",
                          "BLOCK_N": "constexpr"},
            "constexprs": {"ROWS": cfg["ROWS"], "BLOCK_N": cfg["BLOCK_N"]},
            "divisible_by_16": ["N", "stride_dy", "stride_g", "stride_u", "stride_d"] if n % 16 == 0 else [],
            "num_warps": cfg["num_warps"], "num_stages": 1,
        })
    return specs
