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
def _rope_rows(X, Y, POS, COS, SIN, NPOS, block, NH, NROWS, stride_xt, stride_xh, stride_yt, stride_yh,
               D: tl.constexpr, HALF: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
               INVERSE: tl.constexpr):
    # Rows r = token * NH + head of one tensor; for the token's position p and frequency i < HALF:
    #   y[i]        = x[i]        * cos[p, i] - x[i + HALF] * sin[p, i]
    #   y[i + HALF] = x[i + HALF] * cos[p, i] + x[i]        * sin[p, i]
    #   y[j]        = x[j]                          for 2*HALF <= j < D (partial rotary)
    # written uniformly as y[d] = x[d] * c[d] + sign[d] * x[partner(d)] * s[d] with c = 1, s = 0 past 2*HALF.
    # The partner load re-reads the same row (L1 hit); cos/sin rows are gathered from the small fp32 table.
    # INVERSE rotates by -angle (sin -> -sin): the backward, since the rotation is orthogonal.
    # A position outside [0, NPOS) is checked where it is read: it never indexes the table, its rows become NaN.
    r = block * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]      # (BLOCK_R, 1)
    rm = r < NROWS
    tok = (r // NH).to(tl.int64)
    head = r % NH
    d = tl.arange(0, BLOCK_D)[None, :]                        # (1, BLOCK_D)
    rot = d < 2 * HALF
    first = d < HALF
    freq = tl.where(first, d, d - HALF)
    partner = tl.where(first, d + HALF, d - HALF)
    sign = tl.where(first, -1.0, 1.0)
    if INVERSE:
        sign = -sign
    p = tl.load(POS + tok, mask=rm, other=0)
    ok = (p >= 0) & (p < NPOS)
    p = tl.where(ok, p, 0)
    c = tl.load(COS + p * HALF + freq, mask=rm & rot & ok, other=1.0)
    s = tl.load(SIN + p * HALF + freq, mask=rm & rot & ok, other=0.0)
    src = X + tok * stride_xt + head * stride_xh
    x = tl.load(src + d, mask=rm & (d < D), other=0.0).to(tl.float32)
    xp = tl.load(src + partner, mask=rm & rot, other=0.0).to(tl.float32)
    y = x * c + sign * xp * s
    y = tl.where(ok, y, float("nan"))
    tl.store(Y + tok * stride_yt + head * stride_yh + d, y.to(Y.dtype.element_ty), mask=rm & (d < D))


@triton.jit
def _rope_fwd_kernel(Q, K, QO, KO, COS, SIN, POS, NPOS, HQ, HK, ROWS_Q, ROWS_K, PROGS_Q,
                     stride_qt, stride_qh, stride_kt, stride_kh, stride_qot, stride_qoh, stride_kot, stride_koh,
                     D: tl.constexpr, HALF: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                     INVERSE: tl.constexpr):
    # One launch for both tensors: programs [0, PROGS_Q) rotate blocks of q's (token, head) rows, the rest k's.
    pid = tl.program_id(0)
    if pid < PROGS_Q:
        _rope_rows(Q, QO, POS, COS, SIN, NPOS, pid, HQ, ROWS_Q, stride_qt, stride_qh, stride_qot, stride_qoh,
                   D, HALF, BLOCK_R, BLOCK_D, INVERSE)
    else:
        _rope_rows(K, KO, POS, COS, SIN, NPOS, pid - PROGS_Q, HK, ROWS_K, stride_kt, stride_kh, stride_kot,
                   stride_koh, D, HALF, BLOCK_R, BLOCK_D, INVERSE)


def rope_config(d: int) -> dict[str, int]:
    """(BLOCK_R rows x BLOCK_D) tiles of ~2048 elements, 16 per thread."""
    block_d = triton.next_power_of_2(max(d, 2))
    block_r = max(1, 2048 // block_d)
    return {"BLOCK_D": block_d, "BLOCK_R": block_r, "num_warps": max(1, block_r * block_d // 512)}


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def rope_fwd(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, *,
             q_out: torch.Tensor | None = None, k_out: torch.Tensor | None = None, inverse: bool = False):
    """q: (T, Hq, D), k: (T, Hk, D) fp32/fp16/bf16; cos, sin: fp32 (P, half), 2*half <= D; positions: int32 (T,).
    Returns (q_rot, k_rot) in q's and k's dtypes (into q_out / k_out when given, unit last stride); `inverse`
    rotates by -angle (the backward). A position outside [0, P) raises for CPU tensors (read on the host, free);
    on a GPU the kernel checks it where it reads it and writes that token's rows as NaN (no host sync)."""
    if positions.device.type == "cpu":
        from fastenc.reference.rope import check_positions
        check_positions(positions, cos.shape[0])
    q, k = _unit_last(q), _unit_last(k)
    cos, sin = cos.float().contiguous(), sin.float().contiguous()
    positions = positions.to(torch.int32).contiguous()
    t, hq, d = q.shape
    hk = k.shape[1]
    qo = torch.empty((t, hq, d), dtype=q.dtype, device=q.device) if q_out is None else q_out
    ko = torch.empty((t, hk, d), dtype=k.dtype, device=k.device) if k_out is None else k_out
    if t == 0 or d == 0:
        return qo, ko
    cfg = rope_config(d)
    rows_q, rows_k = t * hq, t * hk
    progs_q, progs_k = triton.cdiv(rows_q, cfg["BLOCK_R"]), triton.cdiv(rows_k, cfg["BLOCK_R"])
    with on_device(q):
        _rope_fwd_kernel[(progs_q + progs_k,)](
            q, k, qo, ko, cos, sin, positions, cos.shape[0], hq, hk, rows_q, rows_k, progs_q,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), qo.stride(0), qo.stride(1), ko.stride(0), ko.stride(1),
            D=d, HALF=cos.shape[1], BLOCK_R=cfg["BLOCK_R"], BLOCK_D=cfg["BLOCK_D"], INVERSE=inverse,
            num_warps=cfg["num_warps"])
    return qo, ko


def rope_bwd(grad_q: torch.Tensor, grad_k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             positions: torch.Tensor):
    """Gradients of rope_fwd for q and k: the inverse rotation of the output gradients (same shapes and rules)."""
    return rope_fwd(grad_q, grad_k, cos, sin, positions, inverse=True)


def compile_specs() -> list[dict]:
    specs = []
    # (name, dtype, Hq, Hk, D, half): ModernBERT-base (12 heads x 64), a GQA shape, partial rotary.
    for name, dt, hq, hk, d, half, inv in (("rope_bf16_12x64", "bf16", 12, 12, 64, 32, False),
                                           ("rope_fp16_32x128_gqa8", "fp16", 32, 8, 128, 64, False),
                                           ("rope_fp32_12x64_partial", "fp32", 12, 12, 64, 16, False),
                                           ("rope_bwd_bf16_12x64", "bf16", 12, 12, 64, 32, True),
                                           ("rope_bwd_fp32_12x64_partial", "fp32", 12, 12, 64, 16, True)):
        cfg = rope_config(d)
        p = "*" + dt
        sig = {"Q": p, "K": p, "QO": p, "KO": p, "COS": "*fp32", "SIN": "*fp32", "POS": "*i32", "NPOS": "i32",
               "HQ": "i32", "HK": "i32", "ROWS_Q": "i32", "ROWS_K": "i32", "PROGS_Q": "i32"}
        sig.update({a: "i32" for a in ("stride_qt", "stride_qh", "stride_kt", "stride_kh", "stride_qot",
                                        "stride_qoh", "stride_kot", "stride_koh")})
        sig.update({a: "constexpr" for a in ("D", "HALF", "BLOCK_R", "BLOCK_D", "INVERSE")})
        specs.append({
            "name": name, "fn": _rope_fwd_kernel, "signature": sig,
            "constexprs": {"D": d, "HALF": half, "BLOCK_R": cfg["BLOCK_R"], "BLOCK_D": cfg["BLOCK_D"],
                           "INVERSE": inv},
            "divisible_by_16": [a for a in sig if a.startswith("stride")],
            "num_warps": cfg["num_warps"], "num_stages": 1,
        })
    return specs
