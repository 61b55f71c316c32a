"""Triton LayerNorm / RMSNorm forward with an optional fused residual add (one kernel for both norms).

Algorithm: the row-per-program normalization of Triton's layer-norm tutorial and Apex's fused LayerNorm,
in fp32 registers; small rows are packed several to a program so each program moves ~2-4K elements.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from fastenc.kernels._util import on_device

# Rows whose power-of-two block exceeds this are normalized in chunks (three passes over the row).
MAX_FUSED_BLOCK = 16384


@triton.jit
def _norm_fwd_kernel(X, R, W, B, Y, H, Mean, Rstd, M, N, stride_x, stride_r, stride_y, stride_h, eps,
                     HAS_RES: tl.constexpr, HAS_BIAS: tl.constexpr, IS_RMS: tl.constexpr,
                     BLOCK_N: tl.constexpr, ROWS: tl.constexpr, ONE_PASS: tl.constexpr, STATS: tl.constexpr):
    # Per row of length N (the hidden size):
    #   h      = x + r                 (fused residual; rounded to x's dtype and stored, then normalized)
    #   mean   = sum(h) / N            (LayerNorm only; RMSNorm uses mean = 0)
    #   var    = sum((h - mean)^2) / N (biased variance, two-pass: no sum(h^2) - mean^2 cancellation)
    #   y      = (h - mean) * rsqrt(var + eps) * w (+ b)
    # All arithmetic in fp32; y and h are rounded once to the output dtype.
    # STATS (training): also store mean (LayerNorm) and rstd = rsqrt(var + eps) per row, fp32, for the backward.
    pid = tl.program_id(0)
    rows1 = pid * ROWS + tl.arange(0, ROWS)                    # (ROWS,)
    rows = pid * ROWS + tl.arange(0, ROWS)[:, None]            # (ROWS, 1)
    row_ok = rows < M
    rows64 = rows.to(tl.int64)
    cols = tl.arange(0, BLOCK_N)[None, :]                      # (1, BLOCK_N)
    if ONE_PASS:
        mask = row_ok & (cols < N)
        h = tl.load(X + rows64 * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_RES:
            h += tl.load(R + rows64 * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
            h_low = h.to(H.dtype.element_ty)
            tl.store(H + rows64 * stride_h + cols, h_low, mask=mask)
            h = h_low.to(tl.float32)
        if IS_RMS:
            hc = h
        else:
            mean = tl.sum(h, axis=1) / N
            hc = tl.where(mask, h - mean[:, None], 0.0)
        var = tl.sum(hc * hc, axis=1) / N
        rstd = tl.math.rsqrt(var + eps)
        if STATS:
            tl.store(Rstd + rows1, rstd, mask=rows1 < M)
            if not IS_RMS:
                tl.store(Mean + rows1, mean, mask=rows1 < M)
        w = tl.load(W + cols, mask=cols < N, other=0.0).to(tl.float32)
        y = hc * rstd[:, None] * w
        if HAS_BIAS:
            y += tl.load(B + cols, mask=cols < N, other=0.0).to(tl.float32)
        tl.store(Y + rows64 * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)
    else:
        # Chunked: pass 1 writes h (if residual) and sums it, pass 2 the centred squares, pass 3 writes y.
        # Passes 2 and 3 re-read x (and r) from L2.
        acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            c = start + cols
            mask = row_ok & (c < N)
            h = tl.load(X + rows64 * stride_x + c, mask=mask, other=0.0).to(tl.float32)
            if HAS_RES:
                h += tl.load(R + rows64 * stride_r + c, mask=mask, other=0.0).to(tl.float32)
                h_low = h.to(H.dtype.element_ty)
                tl.store(H + rows64 * stride_h + c, h_low, mask=mask)
                h = h_low.to(tl.float32)
            acc += h
        if IS_RMS:
            mean = tl.zeros([ROWS], dtype=tl.float32)
        else:
            mean = tl.sum(acc, axis=1) / N
        acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            c = start + cols
            mask = row_ok & (c < N)
            h = tl.load(X + rows64 * stride_x + c, mask=mask, other=0.0).to(tl.float32)
            if HAS_RES:  # recomputed, not re-read from H: no cross-thread read-after-write in one program
                h += tl.load(R + rows64 * stride_r + c, mask=mask, other=0.0).to(tl.float32)
                h = h.to(H.dtype.element_ty).to(tl.float32)
            hc = tl.where(mask, h - mean[:, None], 0.0)
            acc += hc * hc
        rstd = tl.math.rsqrt(tl.sum(acc, axis=1) / N + eps)
        if STATS:
            tl.store(Rstd + rows1, rstd, mask=rows1 < M)
            if not IS_RMS:
                tl.store(Mean + rows1, mean, mask=rows1 < M)
        for start in range(0, N, BLOCK_N):
            c = start + cols
            mask = row_ok & (c < N)
            h = tl.load(X + rows64 * stride_x + c, mask=mask, other=0.0).to(tl.float32)
            if HAS_RES:  # recomputed, not re-read from H: no cross-thread read-after-write in one program
                h += tl.load(R + rows64 * stride_r + c, mask=mask, other=0.0).to(tl.float32)
                h = h.to(H.dtype.element_ty).to(tl.float32)
            w = tl.load(W + c, mask=c < N, other=0.0).to(tl.float32)
            y = (h - mean[:, None]) * rstd[:, None] * w
            if HAS_BIAS:
                y += tl.load(B + c, mask=c < N, other=0.0).to(tl.float32)
            tl.store(Y + rows64 * stride_y + c, y.to(Y.dtype.element_ty), mask=mask)


def norm_config(n: int) -> dict[str, int]:
    """Block, rows per program and warps for hidden size n (fp32 registers: <= 32 elements per thread)."""
    block = triton.next_power_of_2(max(n, 1))
    one_pass = block <= MAX_FUSED_BLOCK
    if not one_pass:
        block = 4096
    rows = max(1, min(16, 2048 // block)) if one_pass else 1
    elems = block * rows
    warps = max(2, min(16, elems // 256))
    return {"BLOCK_N": block, "ROWS": rows, "ONE_PASS": one_pass, "num_warps": warps}


def _unit_cols(t: torch.Tensor) -> torch.Tensor:
    """Rows may be strided; columns must be unit-stride for the vectorized loads."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _launch(x, weight, bias, residual, eps, rms, out=None, residual_out=None, stats=False):
    x, weight = _unit_cols(x), weight.contiguous()
    residual = None if residual is None else _unit_cols(residual)
    bias = None if bias is None else bias.contiguous()
    m, n = x.shape
    y = torch.empty_like(x) if out is None else out
    h = None if residual is None else torch.empty_like(x) if residual_out is None else residual_out
    mean = x.new_empty(m, dtype=torch.float32) if stats and not rms else None
    rstd = x.new_empty(m, dtype=torch.float32) if stats else None
    if m == 0 or n == 0:
        return (y, h, mean, rstd) if stats else (y, h)
    cfg = norm_config(n)
    r = residual if residual is not None else x
    grid = (triton.cdiv(m, cfg["ROWS"]),)
    with on_device(x):
        _norm_fwd_kernel[grid](
            x, r, weight, bias if bias is not None else weight, y, h if h is not None else y,
            mean if mean is not None else y, rstd if rstd is not None else y, m, n,
            x.stride(0), r.stride(0), y.stride(0), (h if h is not None else y).stride(0), eps,
            HAS_RES=residual is not None, HAS_BIAS=bias is not None, IS_RMS=rms,
            BLOCK_N=cfg["BLOCK_N"], ROWS=cfg["ROWS"], ONE_PASS=cfg["ONE_PASS"], STATS=stats,
            num_warps=cfg["num_warps"])
    return (y, h, mean, rstd) if stats else (y, h)


def layer_norm_fwd(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   residual: torch.Tensor | None, eps: float, *, out: torch.Tensor | None = None,
                   residual_out: torch.Tensor | None = None, stats: bool = False):
    """x, residual: (rows, hidden) with unit column stride, fp32/fp16/bf16; weight, bias: (hidden,) contiguous.

    Returns (y, x + residual) or (y, None), both (rows, hidden) in x's dtype, written into `out` /
    `residual_out` when given (same shape and dtype as x, unit column stride). stats=True (training) returns
    (y, h, mean, rstd) with mean and rstd (rows,) fp32.
    """
    return _launch(x, weight, bias, residual, eps, False, out, residual_out, stats)


def norm_compile_spec(name: str, dt: str, hidden: int, res: bool, bias: bool, rms: bool, stats: bool = False) -> dict:
    """One compile spec (fastenc/kernels/_compile.py convention) of the shared norm kernel at this width."""
    cfg = norm_config(hidden)
    p = "*" + dt
    return {
        "name": name, "fn": _norm_fwd_kernel,
        "signature": {"X": p, "R": p, "W": p, "B": p, "Y": p, "H": p, "Mean": "*fp32", "Rstd": "*fp32",
                      "M": "i32", "N": "i32",
                      "stride_x": "i32", "stride_r": "i32", "stride_y": "i32", "stride_h": "i32",
                      "eps": "fp32", "HAS_RES": "constexpr", "HAS_BIAS": "constexpr", "IS_RMS": "constexpr",
                      "BLOCK_N": "constexpr", "ROWS": "constexpr", "ONE_PASS": "constexpr", "STATS": "constexpr"},
        "constexprs": {"HAS_RES": res, "HAS_BIAS": bias, "IS_RMS": rms, "BLOCK_N": cfg["BLOCK_N"],
                       "ROWS": cfg["ROWS"], "ONE_PASS": cfg["ONE_PASS"], "STATS": stats},
        "divisible_by_16": ["N", "stride_x", "stride_r", "stride_y", "stride_h"] if hidden % 16 == 0 else [],
        "num_warps": cfg["num_warps"], "num_stages": 1,
    }


def compile_specs() -> list[dict]:
    """Representative configurations for the compile-for-sm_80/sm_90 check (see _compile.py)."""
    specs = []
    cases = [  # (name, dtype, hidden, residual, bias, rms)
        ("ln_fp16_768_res_bias", "fp16", 768, True, True, False),
        ("ln_bf16_1152_res_nobias", "bf16", 1152, True, False, False),
        ("ln_fp32_384", "fp32", 384, False, True, False),
        ("ln_bf16_4096", "bf16", 4096, False, True, False),
        ("ln_fp16_16384_res_bias", "fp16", 16384, True, True, False),
        ("ln_fp32_32768_chunked_res", "fp32", 32768, True, True, False),
        ("rms_bf16_4096_res", "bf16", 4096, True, False, True),
    ]
    for name, dt, hidden, res, bias, rms in cases:
        specs.append(norm_compile_spec(name, dt, hidden, res, bias, rms))
    # training forwards (mean/rstd written)
    specs.append(norm_compile_spec("ln_bf16_768_res_bias_stats", "bf16", 768, True, True, False, stats=True))
    specs.append(norm_compile_spec("ln_fp32_32768_chunked_stats", "fp32", 32768, True, True, False, stats=True))
    return specs
