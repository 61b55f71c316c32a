"""Triton GELU forward and backward (exact erf, tanh or quick form) with an optional fused bias add, on 2-D row tiles.

GELU (Hendrycks & Gimpel 2016): x * Phi(x). Exact erf via tl.math.erf (libdevice erff when compiled, the
interpreter's own erf on CPU); the tanh form rewritten through exp so it needs no tanh intrinsic; quick GELU, the
paper's sigmoid approximation x * sigmoid(1.702 x) (CLIP's quick_gelu), through exp as well.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from fastenc.kernels._util import on_device

TILE = 2048  # elements per program
APPROX = {"none": 0, "tanh": 1, "quick": 2}  # the APPROX constexpr of the kernels, by approximate= name


def approx_code(approximate: str) -> int:
    """The kernels' APPROX constexpr for an approximate= name ('none' | 'tanh' | 'quick')."""
    return APPROX[approximate]


@triton.jit
def _x_sigmoid_f32(x, K: tl.constexpr):
    # x * sigmoid(K x), s = 1 / (1 + exp(-K x)): exp overflows to inf below K x ~ -88, s = 0 and x * s = -0 there
    # (NaN at -inf, as torch's x * sigmoid(K x)); +inf -> inf * 1 = inf. K = 1: SiLU; K = 1.702: quick GELU.
    return x * (1.0 / (1.0 + tl.exp(-(K * x))))


@triton.jit
def _x_sigmoid_grad_f32(x, K: tl.constexpr):
    # d/dx x sigmoid(K x) = s + K x s (1 - s): 0 * -inf = NaN at -inf, 1 + inf * 0 = NaN at +inf, as torch's autograd.
    s = 1.0 / (1.0 + tl.exp(-(K * x)))
    return s + K * x * s * (1.0 - s)


@triton.jit
def _gelu_f32(x, APPROX: tl.constexpr):
    # APPROX 0, exact: gelu(x) = 0.5 * x * (1 + erf(x / sqrt(2)))
    # APPROX 1, tanh:  gelu(x) = 0.5 * x * (1 + tanh(u)),  u = sqrt(2/pi) * (x + 0.044715 x^3)
    #        and 0.5 * (1 + tanh(u)) = sigmoid(2u) = 1 / (1 + exp(-2u)), so gelu(x) = x / (1 + exp(-2u)).
    #        Below x = -13 gelu is -0 to within 1e-37: x * 0 gives -0 there and NaN at -inf, as torch's F.gelu.
    # APPROX 2, quick: gelu(x) = x * sigmoid(1.702 x)
    if APPROX == 2:
        y = _x_sigmoid_f32(x, 1.702)
    elif APPROX == 1:
        u2 = 1.5957691216057308 * (x + 0.044715 * x * x * x)  # 2u, 2 * sqrt(2/pi) = 1.5957691216057308
        y = x / (1.0 + tl.exp(tl.minimum(-u2, 88.0)))  # clamp: exp(88) ~ 1.7e38 is finite, x / it ~ -0
        y = tl.where(x < -13.0, x * 0.0, y)
    else:  # -inf: 0.5 * -inf * (1 + erf(-inf)) = -inf * 0 = NaN, as torch
        y = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    return y


@triton.jit
def _gelu_fwd_kernel(X, B, Y, M, N, stride_x, stride_y, HAS_BIAS: tl.constexpr, APPROX: tl.constexpr,
                     ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    # y[r, c] = gelu(x[r, c] + b[c]) over a (ROWS, BLOCK_N) tile; fp32 math, one rounding at the store.
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    mask = (rows < M) & (cols < N)
    rows64 = rows.to(tl.int64)
    x = tl.load(X + rows64 * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        x += tl.load(B + cols, mask=cols < N, other=0.0).to(tl.float32)
    y = _gelu_f32(x, APPROX)
    tl.store(Y + rows64 * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _gelu_grad_f32(x, APPROX: tl.constexpr):
    # exact: gelu'(x) = Phi(x) + x phi(x),  Phi(x) = (1 + erf(x / sqrt 2)) / 2,  phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
    # tanh:  s = 1 / (1 + exp(-2u)) = (1 + tanh u) / 2,  1 - tanh^2 u = 4 s (1 - s), so
    #        gelu'(x) = s + 2 x s (1 - s) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
    # Beyond |x| = 13 gelu' is the step (1 or 0); + (x - x) keeps NaN at +-inf and for NaN, as torch.
    # quick: s = sigmoid(1.702 x), gelu'(x) = s + 1.702 x s (1 - s) (its own limits, _x_sigmoid_grad_f32)
    if APPROX == 2:
        d = _x_sigmoid_grad_f32(x, 1.702)
    else:
        if APPROX == 1:
            u2 = 1.5957691216057308 * (x + 0.044715 * x * x * x)
            s = 1.0 / (1.0 + tl.exp(tl.minimum(-u2, 88.0)))
            d = s + x * s * (1.0 - s) * 1.5957691216057308 * (1.0 + 0.134145 * x * x)
        else:
            d = 0.5 * (1.0 + tl.math.erf(x * 0.7071067811865476)) + x * tl.exp(-0.5 * x * x) * 0.3989422804014327
        step = tl.where(x > 0.0, 1.0, 0.0) + (x - x)
        d = tl.where(tl.abs(x) > 13.0, step, d)
    return d


@triton.jit
def _gelu_bwd_kernel(G, X, B, DX, P, M, N, stride_g, stride_x, stride_dx, HAS_BIAS: tl.constexpr,
                     APPROX: tl.constexpr, STORE_DX: tl.constexpr, SUM_DBIAS: tl.constexpr,
                     ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    # dx[r, c] = g[r, c] * gelu'(x[r, c] + b[c]) over a (ROWS, BLOCK_N) tile, recomputed from x (fp32 math).
    # STORE_DX: write dx. SUM_DBIAS: P[tile row, c] = sum over the tile's rows of dx[r, c] (fp32), the partial
    # sums of dbias = sum_r dx[r, :], so dbias needs no dx in memory when x needs no gradient.
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    mask = (rows < M) & (cols < N)
    rows64 = rows.to(tl.int64)
    x = tl.load(X + rows64 * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(G + rows64 * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        x += tl.load(B + cols, mask=cols < N, other=0.0).to(tl.float32)
    dx = g * _gelu_grad_f32(x, APPROX)
    if STORE_DX:
        tl.store(DX + rows64 * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
    if SUM_DBIAS:
        part = tl.sum(tl.where(mask, dx, 0.0), axis=0)
        pcols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        tl.store(P + tl.program_id(0).to(tl.int64) * N + pcols, part, mask=pcols < N)


def tile_config(n: int) -> dict[str, int]:
    """(ROWS, BLOCK_N) tile of ~TILE elements for rows of n columns, and warps (16 elements per thread)."""
    block = min(triton.next_power_of_2(max(n, 1)), TILE)
    rows = max(1, TILE // block)
    return {"ROWS": rows, "BLOCK_N": block, "num_warps": max(1, rows * block // 512)}


def gelu_fwd(x: torch.Tensor, bias: torch.Tensor | None, approximate: str, *,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """x: (rows, n) with unit column stride, fp32/fp16/bf16; bias: (n,) contiguous or None.

    Returns gelu(x + bias), (rows, n) in x's dtype (into `out` when given); approximate 'none' (erf), 'tanh' or 'quick'.
    """
    x = x if x.stride(-1) == 1 else x.contiguous()
    bias = None if bias is None else bias.contiguous()
    m, n = x.shape
    y = torch.empty((m, n), dtype=x.dtype, device=x.device) if out is None else out
    if m == 0 or n == 0:
        return y
    cfg = tile_config(n)
    grid = (triton.cdiv(m, cfg["ROWS"]), triton.cdiv(n, cfg["BLOCK_N"]))
    with on_device(x):
        _gelu_fwd_kernel[grid](x, bias if bias is not None else x, y, m, n, x.stride(0), y.stride(0),
                               HAS_BIAS=bias is not None, APPROX=approx_code(approximate),
                               ROWS=cfg["ROWS"], BLOCK_N=cfg["BLOCK_N"], num_warps=cfg["num_warps"])
    return y


def gelu_out(x: torch.Tensor, bias: torch.Tensor | None, approximate: str, out: torch.Tensor) -> None:
    """gelu_fwd into `out` ((rows, n), unit column stride; may be x itself)."""
    gelu_fwd(x, bias, approximate, out=out)


def gelu_bwd(grad: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None, approximate: str,
             need_dx: bool = True, need_dbias: bool = True):
    """grad, x: (rows, n) fp32/fp16/bf16 (unit column stride); bias: (n,) or None.

    Returns (dx (rows, n) in x's dtype, dbias (n,) in x's dtype); dbias is dx summed over rows in fp32. An output
    not needed (need_dx / need_dbias false, or no bias) is an empty tensor and costs nothing: with dx needed, dbias
    sums the written dx; without, the kernel writes only per-tile fp32 column sums of dx."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    grad = grad if grad.stride(-1) == 1 else grad.contiguous()
    bias = None if bias is None else bias.contiguous()
    sum_dbias = bias is not None and need_dbias
    m, n = x.shape
    dx = torch.empty((m, n), dtype=x.dtype, device=x.device) if need_dx else x.new_empty(0)
    fused = sum_dbias and not need_dx
    cfg = tile_config(n)
    tiles = triton.cdiv(m, cfg["ROWS"])
    part = torch.empty((tiles, n), dtype=torch.float32, device=x.device) if fused else None
    if m and n and (need_dx or fused):
        grid = (tiles, triton.cdiv(n, cfg["BLOCK_N"]))
        with on_device(x):
            _gelu_bwd_kernel[grid](grad, x, bias if bias is not None else x, dx if need_dx else x,
                                   part if fused else x, m, n, grad.stride(0), x.stride(0),
                                   dx.stride(0) if need_dx else 0, HAS_BIAS=bias is not None,
                                   APPROX=approx_code(approximate), STORE_DX=need_dx, SUM_DBIAS=fused,
                                   ROWS=cfg["ROWS"], BLOCK_N=cfg["BLOCK_N"], num_warps=cfg["num_warps"])
    if not sum_dbias:
        return dx, x.new_empty(0)
    if fused:
        return dx, part.sum(0).to(x.dtype)
    return dx, dx.sum(0, dtype=torch.float32).to(x.dtype)


def compile_specs() -> list[dict]:
    specs = []
    for name, dt, n, bias, approx in (("gelu_fp16_3072_bias_erf", "fp16", 3072, True, 0),
                                      ("gelu_bf16_1152_tanh", "bf16", 1152, False, 1),
                                      ("gelu_fp32_384_bias_erf", "fp32", 384, True, 0),
                                      ("gelu_fp16_3072_bias_quick", "fp16", 3072, True, 2)):
        cfg = tile_config(n)
        p = "*" + dt
        specs.append({
            "name": name, "fn": _gelu_fwd_kernel,
            "signature": {"X": p, "B": p, "Y": p, "M": "i32", "N": "i32", "stride_x": "i32", "stride_y": "i32",
                          "HAS_BIAS": "constexpr", "APPROX": "constexpr", "ROWS": "constexpr",
                          "BLOCK_N": "constexpr"},
            "constexprs": {"HAS_BIAS": bias, "APPROX": approx, "ROWS": cfg["ROWS"], "BLOCK_N": cfg["BLOCK_N"]},
            "divisible_by_16": ["N", "stride_x", "stride_y"] if n % 16 == 0 else [],
            "num_warps": cfg["num_warps"], "num_stages": 1,
        })
    for name, dt, n, bias, approx, store in (("gelu_bwd_bf16_3072_bias_erf", "bf16", 3072, True, 0, True),
                                             ("gelu_bwd_fp16_1152_tanh", "fp16", 1152, False, 1, True),
                                             ("gelu_bwd_fp32_1000_bias_tanh", "fp32", 1000, True, 1, True),
                                             ("gelu_bwd_bf16_3072_dbias_only", "bf16", 3072, True, 0, False),
                                             ("gelu_bwd_bf16_3072_bias_quick", "bf16", 3072, True, 2, True)):
        cfg = tile_config(n)
        p = "*" + dt
        specs.append({
            "name": name, "fn": _gelu_bwd_kernel,
            "signature": {"G": p, "X": p, "B": p, "DX": p, "P": "*fp32", "M": "i32", "N": "i32", "stride_g": "i32",
                          "stride_x": "i32", "stride_dx": "i32", "HAS_BIAS": "constexpr", "APPROX": "constexpr",
                          "STORE_DX": "constexpr", "SUM_DBIAS": "constexpr", "ROWS": "constexpr",
                          "BLOCK_N": "constexpr"},
            "constexprs": {"HAS_BIAS": bias, "APPROX": approx, "STORE_DX": store, "SUM_DBIAS": not store and bias,
                           "ROWS": cfg["ROWS"], "BLOCK_N": cfg["BLOCK_N"]},
            "divisible_by_16": ["N", "stride_g", "stride_x", "stride_dx"] if n % 16 == 0 else [],
            "num_warps": cfg["num_warps"], "num_stages": 1,
        })
    return specs
