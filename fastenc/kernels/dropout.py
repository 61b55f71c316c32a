"""Triton elementwise dropout with an optional fused bias add, forward and backward, on 2-D row tiles.

out = (x + bias) * Z / (1 - p) and dx = grad * Z / (1 - p), Z the counter-based keep-mask of
fastenc/reference/dropout.py: the attention kernels' hash (fastenc/kernels/attention.py) at head 0, the row of the
(rows, n) view as the token and the column as the key. One 32-bit hash per element, fp32 math, one rounding at the
store; the backward regenerates Z from (seed, offset) (nothing saved). Bytes per element: the forward reads x and
writes out (+ n bias values), the backward reads grad and writes dx: a copy's traffic.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from fastenc.kernels._util import on_device
from fastenc.kernels.attention import _dropout_keep, _dropout_row_keys, dropout_args
from fastenc.kernels.gelu import tile_config  # (ROWS, BLOCK_N) tiles of ~2048 elements, as the elementwise GELU


@triton.jit
def _dropout_kernel(X, B, Y, M, N, stride_x, stride_y, drop_key, drop_thr, drop_scale, HAS_BIAS: tl.constexpr,
                    ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    # y[r, c] = (x[r, c] + b[c]) * keep(r, c) * drop_scale over a (ROWS, BLOCK_N) tile. Row keys from the row index
    # as uint32 (rows past 2^32 wrap, as the CPU kernel's), head 0.
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        x += tl.load(B + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    rkeys = _dropout_row_keys(drop_key, tl.full((), 0, tl.int32), rows)  # (the helper truncates to uint32)
    keep = _dropout_keep(rkeys[:, None], cols[None, :], drop_thr)
    y = tl.where(keep, x * drop_scale, 0.0)
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


def _launch(x: torch.Tensor, bias: torch.Tensor | None, dropout_p: float, seed: int, offset: int) -> torch.Tensor:
    x = x if x.stride(-1) == 1 else x.contiguous()
    bias = None if bias is None else bias.contiguous()
    m, n = x.shape
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y
    key, thr, scale = dropout_args(dropout_p, seed, offset)
    cfg = tile_config(n)
    grid = (triton.cdiv(m, cfg["ROWS"]), triton.cdiv(n, cfg["BLOCK_N"]))
    with on_device(x):
        _dropout_kernel[grid](x, bias if bias is not None else x, y, m, n, x.stride(0), y.stride(0), key, thr, scale,
                              HAS_BIAS=bias is not None, ROWS=cfg["ROWS"], BLOCK_N=cfg["BLOCK_N"],
                              num_warps=cfg["num_warps"])
    return y


def dropout_fwd(x: torch.Tensor, bias: torch.Tensor | None, dropout_p: float, seed: int,
                offset: int) -> torch.Tensor:
    """x: (rows, n) with unit column stride, fp32/fp16/bf16; bias: (n,) or None; 0 < dropout_p < 1.
    Returns (x + bias) * Z / (1 - dropout_p), (rows, n) in x's dtype."""
    return _launch(x, bias, dropout_p, seed, offset)


def dropout_bwd(grad: torch.Tensor, dropout_p: float, seed: int, offset: int) -> torch.Tensor:
    """grad: (rows, n) with unit column stride -> grad * Z / (1 - dropout_p) in grad's dtype (the same Z)."""
    return _launch(grad, None, dropout_p, seed, offset)


def compile_specs() -> list[dict]:
    specs = []
    for name, dt, n, bias in (("dropout_fp32_768_bias", "fp32", 768, True), ("dropout_bf16_3072", "bf16", 3072, False),
                              ("dropout_fp16_1000_bias", "fp16", 1000, True)):
        cfg = tile_config(n)
        p = "*" + dt
        specs.append({
            "name": name, "fn": _dropout_kernel,
            "signature": {"X": p, "B": p, "Y": p, "M": "i32", "N": "i32", "stride_x": "i32", "stride_y": "i32",
                          "drop_key": "i32", "drop_thr": "i32", "drop_scale": "fp32", "HAS_BIAS": "constexpr",
                          "ROWS": "constexpr", "BLOCK_N": "constexpr"},
            "constexprs": {"HAS_BIAS": bias, "ROWS": cfg["ROWS"], "BLOCK_N": cfg["BLOCK_N"]},
            "divisible_by_16": ["N", "stride_x", "stride_y"] if n % 16 == 0 else [],
            "num_warps": cfg["num_warps"], "num_stages": 1,
        })
    return specs
