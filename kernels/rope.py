"""Triton rotary position embedding (RoFormer, Su et al. 2021), rotate-half convention, q and k in one launch.

Matches transformers' apply_rotary_pos_emb: out = x * cos + rotate_half(x) * sin on the first R = 2*half
dims of each head (cos/sin tables hold each frequency once); dims R..D pass through unchanged.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from fastenc.kernels._util import on_device


@triton.jit
def _rope_heads(X, Y, t64, stride_xt, stride_xh, stride_yt, stride_yh, NH, c, s, sign, d, partner, rot,
                D: tl.constexpr, BLOCK_H: tl.constexpr):
    # One token's (NH, D) block: y[h, d] = x[h, d] * c[d] + sign[d] * x[h, partner(d)] * s[d]
    h = tl.arange(0, BLOCK_H)[:, None]
    hm = h < NH
    x = tl.load(X + t64 * stride_xt + h * stride_xh + d, mask=hm & (d < D), other=0.0).to(tl.float32)
    xp = tl.load(X + t64 * stride_xt + h * stride_xh + partner, mask=hm & rot, other=0.0).to(tl.float32)
    y = x * c + sign * xp * s
    tl.store(Y + t64 * stride_yt + h * stride_yh + d, y.to(Y.dtype.element_ty), mask=hm & (d < D))


@triton.jit
def _rope_fwd_kernel(Q, K, QO, KO, COS, SIN, POS, HQ, HK,
                     stride_qt, stride_qh, stride_kt, stride_kh, stride_qot, stride_qoh, stride_kot, stride_koh,
                     D: tl.constexpr, HALF: tl.constexpr, BLOCK_D: tl.constexpr,
                     BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr):
    # For token t at position p, frequency i < HALF (cos/sin rows are (P, HALF), fp32):
    #   y[i]        = x[i]        * cos[p, i] - x[i + HALF] * sin[p, i]
    #   y[i + HALF] = x[i + HALF] * cos[p, i] + x[i]        * sin[p, i]
    #   y[j]        = x[j]                          for 2*HALF <= j < D (partial rotary)
    # written uniformly as y[d] = x[d] * c[d] + sign[d] * x[partner(d)] * s[d] with c = 1, s = 0 past 2*HALF.
    t = tl.program_id(0)
    t64 = t.to(tl.int64)
    p = tl.load(POS + t)
    d = tl.arange(0, BLOCK_D)[None, :]
    rot = d < 2 * HALF
    first = d < HALF
    freq = tl.where(first, d, d - HALF)
    partner = tl.where(first, d + HALF, d - HALF)
    sign = tl.where(first, -1.0, 1.0)
    c = tl.load(COS + p * HALF + freq, mask=rot, other=1.0)
    s = tl.load(SIN + p * HALF + freq, mask=rot, other=0.0)
    _rope_heads(Q, QO, t64, stride_qt, stride_qh, stride_qot, stride_qoh, HQ, c, s, sign, d, partner, rot,
                D, BLOCK_HQ)
    _rope_heads(K, KO, t64, stride_kt, stride_kh, stride_kot, stride_koh, HK, c, s, sign, d, partner, rot,
                D, BLOCK_HK)


def rope_config(hq: int, hk: int, d: int) -> dict[str, int]:
    block_d = triton.next_power_of_2(max(d, 2))
    bhq, bhk = triton.next_power_of_2(max(hq, 1)), triton.next_power_of_2(max(hk, 1))
    warps = max(1, min(8, bhq * block_d // 512))
    return {"BLOCK_D": block_d, "BLOCK_HQ": bhq, "BLOCK_HK": bhk, "num_warps": warps}


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def rope_fwd(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, *,
             q_out: torch.Tensor | None = None, k_out: torch.Tensor | None = None):
    """q: (T, Hq, D), k: (T, Hk, D) fp32/fp16/bf16; cos, sin: fp32 (P, half), 2*half <= D; positions: int32 (T,)
    in [0, P). Returns (q_rot, k_rot) in q's and k's dtypes (into q_out / k_out when given, unit last stride)."""
    q, k = _unit_last(q), _unit_last(k)
    cos, sin = cos.float().contiguous(), sin.float().contiguous()
    positions = positions.to(torch.int32).contiguous()
    t, hq, d = q.shape
    hk = k.shape[1]
    qo = torch.empty((t, hq, d), dtype=q.dtype, device=q.device) if q_out is None else q_out
    ko = torch.empty((t, hk, d), dtype=k.dtype, device=k.device) if k_out is None else k_out
    if t == 0 or d == 0:
        return qo, ko
    cfg = rope_config(hq, hk, d)
    with on_device(q):
        _rope_fwd_kernel[(t,)](q, k, qo, ko, cos, sin, positions, hq, hk,
                               q.stride(0), q.stride(1), k.stride(0), k.stride(1),
                               qo.stride(0), qo.stride(1), ko.stride(0), ko.stride(1),
                               D=d, HALF=cos.shape[1], BLOCK_D=cfg["BLOCK_D"], BLOCK_HQ=cfg["BLOCK_HQ"],
                               BLOCK_HK=cfg["BLOCK_HK"], num_warps=cfg["num_warps"])
    return qo, ko


def compile_specs() -> list[dict]:
    specs = []
    # (name, dtype, Hq, Hk, D, half): ModernBERT-base (12 heads x 64), a GQA shape, partial rotary.
    for name, dt, hq, hk, d, half in (("rope_bf16_12x64", "bf16", 12, 12, 64, 32),
                                      ("rope_fp16_32x128_gqa8", "fp16", 32, 8, 128, 64),
                                      ("rope_fp32_12x64_partial", "fp32", 12, 12, 64, 16)):
        cfg = rope_config(hq, hk, d)
        p = "*" + dt
        sig = {"Q": p, "K": p, "QO": p, "KO": p, "COS": "*fp32", "SIN": "*fp32", "POS": "*i32",
               "HQ": "i32", "HK": "i32"}
        sig.update({a: "i32" for a in ("stride_qt", "stride_qh", "stride_kt", "stride_kh", "stride_qot",
                                        "stride_qoh", "stride_kot", "stride_koh")})
        sig.update({a: "constexpr" for a in ("D", "HALF", "BLOCK_D", "BLOCK_HQ", "BLOCK_HK")})
        specs.append({
            "name": name, "fn": _rope_fwd_kernel, "signature": sig,
            "constexprs": {"D": d, "HALF": half, "BLOCK_D": cfg["BLOCK_D"], "BLOCK_HQ": cfg["BLOCK_HQ"],
                           "BLOCK_HK": cfg["BLOCK_HK"]},
            "divisible_by_16": [a for a in sig if a.startswith("stride")],
            "num_warps": cfg["num_warps"], "num_stages": 1,
        })
    return specs
