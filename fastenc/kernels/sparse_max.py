"""Triton kernel of SPLADE max-pooled sparse weights: out[s, v] = log1p(relu(max over the tokens t of sequence s of
(x_t . W_v) + b_v)), fp32 out. One program per (sequence, block of BLOCK_V vocabulary columns): it walks the
sequence's tokens BLOCK_T at a time, forms the (BLOCK_T, BLOCK_V) logits tile with tl.dot over H in BLOCK_H steps
(fp32 accumulation) and keeps only the running column max; the (tokens, V) logits never exist."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from fastenc.kernels._util import on_device


@triton.jit
def _sparse_max_fwd_kernel(X, CU, W, B, OUT, H, V, stride_x, stride_w, stride_o, HAS_BIAS: tl.constexpr,
                           UPCAST: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_V: tl.constexpr,
                           BLOCK_H: tl.constexpr):
    s = tl.program_id(0)
    pv = tl.program_id(1)
    start = tl.load(CU + s)
    end = tl.load(CU + s + 1)
    cols = pv * BLOCK_V + tl.arange(0, BLOCK_V)
    cmask = cols < V
    m = tl.full([BLOCK_V], float("-inf"), tl.float32)
    for t0 in range(start, end, BLOCK_T):
        rows = t0 + tl.arange(0, BLOCK_T)
        rmask = rows < end
        acc = tl.zeros([BLOCK_T, BLOCK_V], dtype=tl.float32)
        for h0 in range(0, H, BLOCK_H):
            hs = h0 + tl.arange(0, BLOCK_H)
            hmask = hs < H
            xt = tl.load(X + rows[:, None].to(tl.int64) * stride_x + hs[None, :],
                         mask=rmask[:, None] & hmask[None, :], other=0.0)
            wt = tl.load(W + cols[None, :].to(tl.int64) * stride_w + hs[:, None],
                         mask=cmask[None, :] & hmask[:, None], other=0.0)  # (BLOCK_H, BLOCK_V) = W^T tile
            if UPCAST:  # fp32 operands (fp32 inputs; and under the interpreter, whose bf16 tl.dot is wrong)
                acc += tl.dot(xt.to(tl.float32), wt.to(tl.float32), input_precision="ieee")
            else:
                acc += tl.dot(xt, wt)
        # max over this tile's real tokens only (the masked rows are -inf), joined to the running max
        m = tl.maximum(m, tl.max(tl.where(rmask[:, None], acc, float("-inf")), axis=0))
    if HAS_BIAS:  # max(a + b) = max(a) + b: the bias after the max
        m += tl.load(B + cols, mask=cmask, other=0.0).to(tl.float32)
    r = tl.maximum(m, 0.0)  # relu; an empty sequence (m = -inf) gives 0
    # log1p(r) without losing small r: u = 1 + r rounded; log(u) * r / (u - 1) is exact to rounding (u == 1: r)
    u = 1.0 + r
    y = tl.where(u == 1.0, r, tl.log(u) * (r / tl.where(u == 1.0, 1.0, u - 1.0)))
    tl.store(OUT + s * stride_o + cols, y, mask=cmask)


def tile_config(h: int, fp32_dot: bool) -> dict[str, int]:
    """Tiles per program; an fp32 (ieee, FMA) dot holds its operand tiles in registers: a narrower H step there
    (BLOCK_H 64 spilled on sm_80)."""
    if fp32_dot:
        return {"BLOCK_T": 32, "BLOCK_V": 64, "BLOCK_H": 16, "num_warps": 4}
    return {"BLOCK_T": 32, "BLOCK_V": 64, "BLOCK_H": 64 if h >= 64 else 32, "num_warps": 4}


def sparse_max_fwd(x: torch.Tensor, cu_seqlens: torch.Tensor, weight: torch.Tensor,
                   bias: torch.Tensor | None) -> torch.Tensor:
    """x: (tokens, H) fp32/fp16/bf16 (unit column stride); cu_seqlens: int32 (batch+1,) validated by the caller;
    weight: (V, H) x's dtype; bias: (V,) or None. Returns (batch, V) fp32."""
    from fastenc.backends.triton import interpreter_on

    x = x if x.stride(-1) == 1 else x.contiguous()
    weight = weight if weight.stride(-1) == 1 else weight.contiguous()
    batch, (V, H) = cu_seqlens.shape[0] - 1, weight.shape
    out = torch.empty(batch, V, device=x.device, dtype=torch.float32)
    if batch == 0 or V == 0:
        return out
    upcast = x.dtype == torch.float32 or interpreter_on()
    cfg = tile_config(H, upcast and not interpreter_on())  # (the interpreter: fewer, larger tile steps)
    b = bias.contiguous() if bias is not None else out
    grid = (batch, triton.cdiv(V, cfg["BLOCK_V"]))
    with on_device(x):
        _sparse_max_fwd_kernel[grid](x, cu_seqlens, weight, b, out, H, V, x.stride(0), weight.stride(0),
                                     out.stride(0), HAS_BIAS=bias is not None, UPCAST=upcast,
                                     BLOCK_T=cfg["BLOCK_T"], BLOCK_V=cfg["BLOCK_V"], BLOCK_H=cfg["BLOCK_H"],
                                     num_warps=cfg["num_warps"])
    return out


def compile_specs() -> list[dict]:
    specs = []
    for name, dt, h, bias in (("sparse_max_bf16_768_bias", "bf16", 768, True), ("sparse_max_fp16_384", "fp16", 384, False),
                              ("sparse_max_fp32_768_bias", "fp32", 768, True)):
        cfg = tile_config(h, dt == "fp32")
        p = "*" + dt
        specs.append({
            "name": name, "fn": _sparse_max_fwd_kernel,
            "signature": {"X": p, "CU": "*i32", "W": p, "B": p, "OUT": "*fp32", "H": "i32", "V": "i32",
                          "stride_x": "i32", "stride_w": "i32", "stride_o": "i32", "HAS_BIAS": "constexpr",
                          "UPCAST": "constexpr", "BLOCK_T": "constexpr", "BLOCK_V": "constexpr",
                          "BLOCK_H": "constexpr"},
            "constexprs": {"HAS_BIAS": bias, "UPCAST": dt == "fp32", "BLOCK_T": cfg["BLOCK_T"],
                           "BLOCK_V": cfg["BLOCK_V"], "BLOCK_H": cfg["BLOCK_H"]},
            "divisible_by_16": ["H", "stride_x", "stride_w"],
            "num_warps": cfg["num_warps"], "num_stages": 1,
        })
    return specs
