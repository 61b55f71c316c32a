"""Triton attention backward, FlashAttention-2's (Dao, 2023), for the packed variable-length layout with a sliding
window: the probabilities are recomputed tile by tile from the forward's log-sum-exp, never stored.

Three kernels:
  _attention_bwd_preprocess_kernel  D = rowsum(dO * O) per (token, head)
  _attention_bwd_dkdv_kernel        one program per (key tile, head, sequence): loops over the query tiles of the
                                    window's band, accumulating dK and dV in registers
  _attention_bwd_dq_kernel          one program per (query tile, head, sequence): loops over the key tiles of the
                                    band, accumulating dQ in registers
dQ by query tile in a second kernel, not with atomics into a shared fp32 buffer: the result is deterministic, needs
no fp32 dQ buffer nor a conversion pass, and runs under the CPU interpreter; it costs recomputing S and dP (7 tile
products per tile pair instead of 5), which encoder-length sequences (<= a few thousand tokens) pay readily.
Layout: grad, q, k, v, out, dq, dk, dv (total_tokens, heads, head_dim); lse, D (heads, total_tokens) fp32.
Dropout (DROPOUT, keep-mask Z regenerated from the forward's seed and offset, fastenc/kernels/attention.py), with
Pd = P * Z / (1-p):  dV += Pd^T dO;  dS = P * (dP * Z/(1-p) - D) = Pd * dP - P * D  (D = rowsum(dO * O) as before).
A gradient not needed skips its kernel (dQ, or dK/dV).
A distance bias (HAS_BIAS: lookup BIAS (heads, 2L - 1), fastenc/kernels/attention.py) is added to s in both
kernels; its gradient dBIAS[h, i - j + L - 1] += dS_ij is accumulated by the dQ kernel (which then always runs) with
fp32 atomics: not bit-reproducible from run to run on a GPU (the cpu backend's is).
Per-token positions and DeBERTa's c2p / p2c (fastenc/kernels/_attention_rel.py) are added to s as in the forward;
dC2P[i, h, slot(i, j)] += dS_ij is accumulated by the dQ kernel and dP2C[j, h, slot(i, j)] += dS_ij by the dK/dV
kernel, each into rows of tokens only that program owns (fp32 atomics, since pairs of one row can share a slot);
each kernel then runs whatever need_dq / need_dkdv say.
cu_seqlens is read by the kernels and clamped to [0, total_tokens] where read, so no access leaves the tensors.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from fastenc.kernels._attention_rel import _disentangled, _positions, _scatter_rel, check_relative
from fastenc.kernels._util import on_device
from fastenc.kernels.attention import _distance_bias, _dropout_keep, _dropout_row_keys, check_bias, dropout_args

LOG2E = 1.4426950408889634


@triton.jit
def _seq_bounds(CU, b, total):
    # cu_seqlens[b], cu_seqlens[b + 1] clamped to 0 <= start <= end <= total (a corrupt entry reads nothing outside).
    start = tl.minimum(tl.maximum(tl.load(CU + b), 0), total)
    end = tl.minimum(tl.maximum(tl.load(CU + b + 1), start), total)
    return start, end - start


@triton.jit
def _attention_bwd_preprocess_kernel(O, DO, DELTA, total, stride_t, stride_h,
                                     D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr):
    # DELTA[h, t] = sum_d dO[t, h, d] * O[t, h, d]  (fp32), the row term of dS = P * (dP - D).
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    h = tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    ok = (t < total)[:, None] & (offs_d < D)[None, :]
    ptr = t[:, None].to(tl.int64) * stride_t + h * stride_h + offs_d[None, :]
    o = tl.load(O + ptr, mask=ok, other=0.0).to(tl.float32)
    do = tl.load(DO + ptr, mask=ok, other=0.0).to(tl.float32)
    tl.store(DELTA + h.to(tl.int64) * total + t, tl.sum(o * do, 1), mask=t < total)


@triton.jit
def _attention_bwd_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, CU, total, n_tiles, stride_t, stride_h, window_left,
                               window_right, qk_scale, scale, drop_key, drop_thr, drop_scale, BIAS, bias_len,
                               POS, C2P, P2C, SLOT, DP2C, slots,
                               D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                               HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, IEEE: tl.constexpr,
                               DROPOUT: tl.constexpr, HAS_BIAS: tl.constexpr = False, HAS_POS: tl.constexpr = False,
                               HAS_C2P: tl.constexpr = False, HAS_P2C: tl.constexpr = False):
    # Program (key tile n, sequence b) on grid axis 0 = n_tiles * batch (grid y/z stop at 65,535), head h on
    # axis 1. In base 2, s = q.k * scale * log2(e), lse2 = lse * log2(e):
    #   for each query tile i of the band (queries i with j - right <= i <= j + left):
    #     P^T  = 2^(s^T - lse2)          (BLOCK_N x BLOCK_M; 0 outside the sequence / window)
    #     dV  += P^T dO
    #     dP^T = V dO^T;  dS^T = P^T * (dP^T - D)
    #     dK  += dS^T Q
    #   dK *= scale.
    # DROPOUT: Pd^T = P^T * Z^T / (1-p);  dV += Pd^T dO;  dS^T = Pd^T * dP^T - P^T * D.
    # Relative terms (fastenc/kernels/_attention_rel.py) are added to s^T as in the forward; HAS_P2C:
    # dP2C[j, h, slot(i, j)] += dS_ij for the keys j of this tile (fp32 atomics into rows only this program writes).
    pid = tl.program_id(0)
    b = pid // n_tiles
    pid_n = pid - b * n_tiles
    h = tl.program_id(1)
    start, seqlen = _seq_bounds(CU, b, total)
    n0 = pid_n * BLOCK_N
    if n0 >= seqlen:
        return
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    col_ok = offs_n < seqlen
    d_ok = offs_d < D
    base = start.to(tl.int64) * stride_t + h * stride_h
    kv_ptr = base + offs_n[:, None].to(tl.int64) * stride_t + offs_d[None, :]
    kv_mask = col_ok[:, None] & d_ok[None, :]
    k = tl.load(K + kv_ptr, mask=kv_mask, other=0.0)
    v = tl.load(V + kv_ptr, mask=kv_mask, other=0.0)
    row_base = h.to(tl.int64) * total + start
    pos_n = offs_n
    if HAS_POS:
        pos_n = _positions(POS, start + offs_n, col_ok, bias_len)

    lo = 0
    hi = seqlen
    if HAS_RIGHT:
        lo = tl.maximum(n0 - window_right, 0)
        lo = (lo // BLOCK_M) * BLOCK_M
    if HAS_LEFT:
        hi = tl.minimum(n0 + BLOCK_N + window_left, seqlen)

    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    for m0 in range(lo, hi, BLOCK_M):
        rows = m0 + offs_m
        row_ok = rows < hi
        q_ptr = base + rows[:, None].to(tl.int64) * stride_t + offs_d[None, :]
        q_mask = row_ok[:, None] & d_ok[None, :]
        q = tl.load(Q + q_ptr, mask=q_mask, other=0.0)             # (BLOCK_M, BLOCK_D)
        do = tl.load(DO + q_ptr, mask=q_mask, other=0.0)
        lse2 = tl.load(LSE + row_base + rows, mask=row_ok, other=0.0) * 1.4426950408889634
        delta = tl.load(DELTA + row_base + rows, mask=row_ok, other=0.0)
        if IEEE:
            st = tl.dot(k, tl.trans(q), input_precision="ieee")
        else:
            st = tl.dot(k, tl.trans(q))
        st = st * qk_scale
        if HAS_BIAS or HAS_C2P or HAS_P2C:
            if HAS_POS:
                dist = _positions(POS, start + rows, row_ok, bias_len)[None, :] - pos_n[:, None]
            else:
                dist = rows[None, :] - pos_n[:, None]
        if HAS_BIAS:
            st += _distance_bias(BIAS, bias_len, h, dist)
        if HAS_C2P or HAS_P2C:
            rel, slot = _disentangled(C2P, P2C, SLOT, bias_len, slots, h, start + rows[None, :],
                                      start + offs_n[:, None], dist, col_ok[:, None] & row_ok[None, :], HAS_C2P,
                                      HAS_P2C)
            st += rel
        keep = col_ok[:, None] & row_ok[None, :]
        if HAS_LEFT:
            keep = keep & (offs_n[:, None] >= rows[None, :] - window_left)
        if HAS_RIGHT:
            keep = keep & (offs_n[:, None] <= rows[None, :] + window_right)
        pt = tl.where(keep, tl.math.exp2(st - lse2[None, :]), 0.0)  # lse2 = +inf (no key): 0
        pdt = pt
        if DROPOUT:
            rkeys = _dropout_row_keys(drop_key, h, start + rows)
            pdt = tl.where(_dropout_keep(rkeys[None, :], offs_n[:, None], drop_thr), pt * drop_scale, 0.0)
        if IEEE:
            dv += tl.dot(pdt, do, input_precision="ieee")
            dpt = tl.dot(v, tl.trans(do), input_precision="ieee")
        else:
            dv += tl.dot(pdt.to(do.dtype), do)
            dpt = tl.dot(v, tl.trans(do))
        if DROPOUT:
            dst = pdt * dpt - pt * delta[None, :]
        else:
            dst = pt * (dpt - delta[None, :])
        if HAS_P2C:
            _scatter_rel(DP2C, start + offs_n[:, None], h, slots, slot, dst, keep)
        if IEEE:
            dk += tl.dot(dst, q, input_precision="ieee")
        else:
            dk += tl.dot(dst.to(q.dtype), q)
    tl.store(DK + kv_ptr, (dk * scale).to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + kv_ptr, dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _attention_bwd_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, CU, total, n_tiles, stride_t, stride_h, window_left,
                             window_right, qk_scale, scale, drop_key, drop_thr, drop_scale, BIAS, DBIAS, bias_len,
                             POS, C2P, P2C, SLOT, DC2P, slots,
                             D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, IEEE: tl.constexpr,
                             DROPOUT: tl.constexpr, HAS_BIAS: tl.constexpr = False, HAS_POS: tl.constexpr = False,
                             HAS_C2P: tl.constexpr = False, HAS_P2C: tl.constexpr = False):
    # Program (query tile m, sequence b) on grid axis 0 = n_tiles * batch, head h on axis 1:
    #   for each key tile j of the band (keys j with i - left <= j <= i + right):
    #     P = 2^(s - lse2);  dP = dO V^T;  dS = P * (dP - D);  dQ += dS K
    #   dQ *= scale.
    # DROPOUT: dS = Pd * dP - P * D with Pd = P * Z / (1-p).
    # HAS_BIAS: s += bias(i - j); dBIAS[h, i - j + L - 1] += dS_ij (fp32 atomics, inside the lookup only).
    # Relative terms as in the forward (i - j becomes POS[i] - POS[j] with HAS_POS); HAS_C2P:
    # dC2P[i, h, slot(i, j)] += dS_ij for the queries i of this tile (fp32 atomics into rows only this program writes).
    pid = tl.program_id(0)
    b = pid // n_tiles
    pid_m = pid - b * n_tiles
    h = tl.program_id(1)
    start, seqlen = _seq_bounds(CU, b, total)
    m0 = pid_m * BLOCK_M
    if m0 >= seqlen:
        return
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < seqlen
    d_ok = offs_d < D
    base = start.to(tl.int64) * stride_t + h * stride_h
    q_ptr = base + offs_m[:, None].to(tl.int64) * stride_t + offs_d[None, :]
    q_mask = row_ok[:, None] & d_ok[None, :]
    q = tl.load(Q + q_ptr, mask=q_mask, other=0.0)
    do = tl.load(DO + q_ptr, mask=q_mask, other=0.0)
    row_base = h.to(tl.int64) * total + start
    lse2 = tl.load(LSE + row_base + offs_m, mask=row_ok, other=0.0) * 1.4426950408889634
    delta = tl.load(DELTA + row_base + offs_m, mask=row_ok, other=0.0)
    if DROPOUT:
        rkeys = _dropout_row_keys(drop_key, h, start + offs_m)
    pos_m = offs_m
    if HAS_POS:
        pos_m = _positions(POS, start + offs_m, row_ok, bias_len)

    lo = 0
    hi = seqlen
    if HAS_LEFT:
        lo = tl.maximum(m0 - window_left, 0)
        lo = (lo // BLOCK_N) * BLOCK_N
    if HAS_RIGHT:
        hi = tl.minimum(m0 + BLOCK_M + window_right, seqlen)

    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for n0 in range(lo, hi, BLOCK_N):
        cols = n0 + offs_n
        col_ok = cols < hi
        kv_ptr = base + cols[:, None].to(tl.int64) * stride_t + offs_d[None, :]
        kv_mask = col_ok[:, None] & d_ok[None, :]
        k = tl.load(K + kv_ptr, mask=kv_mask, other=0.0)           # (BLOCK_N, BLOCK_D)
        v = tl.load(V + kv_ptr, mask=kv_mask, other=0.0)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
            dp = tl.dot(do, tl.trans(v), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
            dp = tl.dot(do, tl.trans(v))
        s = s * qk_scale
        if HAS_BIAS or HAS_C2P or HAS_P2C:
            if HAS_POS:
                dist = pos_m[:, None] - _positions(POS, start + cols, col_ok, bias_len)[None, :]
            else:
                dist = pos_m[:, None] - cols[None, :]
        if HAS_BIAS:
            s += _distance_bias(BIAS, bias_len, h, dist)
        if HAS_C2P or HAS_P2C:
            rel, slot = _disentangled(C2P, P2C, SLOT, bias_len, slots, h, start + offs_m[:, None],
                                      start + cols[None, :], dist, row_ok[:, None] & col_ok[None, :], HAS_C2P,
                                      HAS_P2C)
            s += rel
        keep = row_ok[:, None] & col_ok[None, :]
        if HAS_LEFT:
            keep = keep & (cols[None, :] >= offs_m[:, None] - window_left)
        if HAS_RIGHT:
            keep = keep & (cols[None, :] <= offs_m[:, None] + window_right)
        p = tl.where(keep, tl.math.exp2(s - lse2[:, None]), 0.0)
        if DROPOUT:
            pd = tl.where(_dropout_keep(rkeys[:, None], cols[None, :], drop_thr), p * drop_scale, 0.0)
            ds = pd * dp - p * delta[:, None]
        else:
            ds = p * (dp - delta[:, None])
        if HAS_BIAS:
            bidx = dist + (bias_len - 1) // 2
            tl.atomic_add(DBIAS + h.to(tl.int64) * bias_len + bidx, ds,
                          mask=keep & (bidx >= 0) & (bidx < bias_len))
        if HAS_C2P:
            _scatter_rel(DC2P, start + offs_m[:, None], h, slots, slot, ds, keep)
        if IEEE:
            dq += tl.dot(ds, k, input_precision="ieee")
        else:
            dq += tl.dot(ds.to(k.dtype), k)
    tl.store(DQ + q_ptr, (dq * scale).to(DQ.dtype.element_ty), mask=q_mask)


@dataclass(frozen=True)
class AttentionBwdConfig:
    """Launch configuration of the dK/dV and dQ kernels: block_m queries x block_n keys per tile pair."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def block_d(head_dim: int) -> int:
    """Head dim padded to a power of two >= 16 (tl.dot's smallest K)."""
    return max(16, triton.next_power_of_2(head_dim))


def default_config(head_dim: int, dtype: torch.dtype, cc: int | None, dropout: bool = False,
                   biased: bool = False, disentangled: bool = False) -> AttentionBwdConfig:
    """Analytical choice per head dim (cc = major*10+minor; None = CPU interpreter). dK and dV (or dQ) accumulate
    in fp32 registers next to the K, V (or Q, dO) tiles: wide heads get shorter tiles so nothing spills. The
    dropout hash's temporaries (per tile element) take registers too: fp16/bf16 head dims 72..128 go to 64 x 32
    tiles, 136..256 to 16 x 32 (64 x 64 spilled 24 B at head dim 128 on sm_90, 32 x 32 16 B at 256 on sm_80).
    The distance bias's gather and atomics (biased) in fp32: 16 x 16 tiles over 4 warps up to head dim 64, the
    dropout path's 16 x 32 up to 128 (32 x 32 x 8 warps, 16 x 32 and 32 x 16 x 4 warps each spilled 4-8 B in the
    dQ kernel at head dim 64 on sm_80). DeBERTa's c2p / p2c (disentangled: their gathers and scatter atomics): 64 x 32
    tiles up to head dim 64, 16 x 32 beyond (64 x 64 spilled 2 KB in the dK/dV kernel, 32 x 32 8-20 B), fp32
    16 x 16 over 4 warps up to 64 and 8 beyond."""
    bd = block_d(head_dim)
    if cc is None:  # interpreter: few large tiles
        return AttentionBwdConfig(64, 64, 4, 1)
    if disentangled:
        if dtype == torch.float32:
            return AttentionBwdConfig(16, 16, 4 if bd <= 64 else 8, 1)
        return AttentionBwdConfig(64, 32, 8, 1) if bd <= 64 else AttentionBwdConfig(16, 32, 8, 1)
    if dtype == torch.float32:  # IEEE fp32 dots (no tensor-core path): small tiles over 8 warps
        if biased and bd <= 64:
            return AttentionBwdConfig(16, 16, 4, 1)
        if (dropout or biased) and 64 < bd <= 128:  # 8 warps spilled 8 B at head dim 128 on sm_80 with dropout
            return AttentionBwdConfig(16, 32, 4, 1)
        return AttentionBwdConfig(32, 32, 8, 1) if bd <= 64 else AttentionBwdConfig(16, 32, 8, 1)
    if dropout and bd > 64:
        return AttentionBwdConfig(64, 32, 8, 2) if bd <= 128 else AttentionBwdConfig(16, 32, 8, 1)
    if bd <= 64:  # 4 warps hold dK + dV (or dQ) at 64 x 64 only by spilling on sm_80
        return AttentionBwdConfig(64, 64, 8, 2)
    if bd <= 128:
        return AttentionBwdConfig(64, 64, 8, 2)
    return AttentionBwdConfig(32, 32, 8, 1)


def attention_bwd(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                  lse: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, window_left: int, window_right: int,
                  scale: float, dropout_p: float = 0.0, seed: int = 0, offset: int = 0, need_dq: bool = True,
                  need_dkdv: bool = True, bias: torch.Tensor | None = None, positions: torch.Tensor | None = None,
                  c2p: torch.Tensor | None = None, p2c: torch.Tensor | None = None, slot: torch.Tensor | None = None,
                  config: AttentionBwdConfig | None = None):
    """grad, q, k, v, out: (total_tokens, heads, head_dim) contiguous fp16/bf16/fp32; lse: (heads, total_tokens)
    fp32 from the forward; cu_seqlens int32 (batch + 1,); window -1 = unbounded; dropout_p, seed, offset: the
    forward's. Returns (dq, dk, dv) like q; one not needed (need_dq / need_dkdv false) is empty and its kernel
    does not run. bias, positions, c2p, p2c, slot: the forward's relative terms (fastenc/kernels/attention.py); given
    any of them the result is (dq, dk, dv, dbias, dc2p, dp2c): dbias (heads, 2L - 1), dc2p / dp2c (total_tokens,
    heads, slots), all fp32 (fastenc::attention_bwd_bias casts dc2p / dp2c to c2p's dtype), each empty whose input
    is None. dbias and dc2p come from the dQ kernel, dp2c from the dK/dV kernel (each then runs whatever need_dq /
    need_dkdv say). Extra memory: the fp32 dc2p / dp2c buffers, tokens x heads x slots each."""
    total, heads, d = q.shape
    bias, bias_len = check_bias(bias, heads, max_seqlen, q.device)
    rel = check_relative(q, bias, bias_len, max_seqlen, positions, c2p, p2c, slot, "attention backward (triton)")
    dbias = None if bias is None else torch.zeros_like(bias)
    drel = [None if t is None else torch.zeros(t.shape, dtype=torch.float32, device=q.device)
            for t in (rel.c2p, rel.p2c)]
    run_dq = need_dq or bias is not None or rel.c2p is not None
    run_dkdv = need_dkdv or rel.p2c is not None
    dq = torch.empty_like(q) if run_dq else q.new_empty(0)
    dk = torch.empty_like(k) if run_dkdv else q.new_empty(0)
    dv = torch.empty_like(v) if run_dkdv else q.new_empty(0)
    batch = cu_seqlens.numel() - 1
    any_rel = bias is not None or rel.any
    result = (lambda: _result(dq, dk, dv, dbias, need_dq, need_dkdv, drel if any_rel else None))
    if total == 0 or batch == 0 or heads == 0:
        dq.zero_(), dk.zero_(), dv.zero_()
        return result()
    cu = cu_seqlens.to(device=q.device, dtype=torch.int32).contiguous()
    grad, q, k, v, out = (t.contiguous() for t in (grad, q, k, v, out))
    lse = lse.contiguous()
    delta = torch.empty((heads, total), dtype=torch.float32, device=q.device)
    bd = block_d(d)
    cfg = config or default_config(d, q.dtype, None if not q.is_cuda else _cc(q), dropout_p > 0,
                                   bias is not None or rel.any, rel.slot is not None)
    common = dict(D=d, BLOCK_D=bd, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, HAS_LEFT=window_left >= 0,
                  HAS_RIGHT=window_right >= 0, IEEE=q.dtype == torch.float32, DROPOUT=dropout_p > 0,
                  HAS_BIAS=bias is not None, **rel.flags(), num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if heads > 65535:
        raise ValueError(f"attention backward (triton): heads must be <= 65535 (grid axis 1), got {heads}")
    rest = (heads * d, d, max(window_left, 0), max(window_right, 0), scale * LOG2E, scale,
            *dropout_args(dropout_p, seed, offset))
    b_ptr = delta if bias is None else bias  # (not read without HAS_BIAS)
    db_ptr = delta if dbias is None else dbias
    pos, c2p, p2c, slot, slots = rel.pointers(cu, q)
    dc2p, dp2c = (delta if t is None else t for t in drel)
    seq = max(min(max_seqlen, total), 1)
    n_kv, n_q = triton.cdiv(seq, cfg.block_n), triton.cdiv(seq, cfg.block_m)
    with on_device(q):
        _attention_bwd_preprocess_kernel[(triton.cdiv(total, 64), heads)](
            out, grad, delta, total, heads * d, d, D=d, BLOCK_D=bd, BLOCK_T=64)
        if run_dkdv:
            _attention_bwd_dkdv_kernel[(n_kv * batch, heads)](
                q, k, v, grad, lse, delta, dk, dv, cu, total, n_kv, *rest, b_ptr, rel.rel_len, pos, c2p, p2c, slot,
                dp2c, slots, **common)
        if run_dq:
            _attention_bwd_dq_kernel[(n_q * batch, heads)](
                q, k, v, grad, lse, delta, dq, cu, total, n_q, *rest, b_ptr, db_ptr, rel.rel_len, pos, c2p, p2c,
                slot, dc2p, slots, **common)
    return result()


def _result(dq, dk, dv, dbias, need_dq, need_dkdv, drel):
    """(dq, dk, dv) or, with a relative term, (dq, dk, dv, dbias, dc2p, dp2c), the last three fp32 and empty where
    their input is None."""
    dq = dq if need_dq else dq.new_empty(0)
    dk, dv = (dk, dv) if need_dkdv else (dk.new_empty(0), dv.new_empty(0))
    if drel is None:
        return dq, dk, dv
    return (dq, dk, dv) + tuple(dq.new_empty(0, dtype=torch.float32) if t is None else t for t in (dbias, *drel))


def _cc(t: torch.Tensor) -> int:
    major, minor = torch.cuda.get_device_capability(t.device)
    return major * 10 + minor


def compile_specs() -> list[dict]:
    """Ahead-of-time compile configurations (fastenc/kernels/_compile.py; each compiled for sm_90 and sm_80): the three
    kernels at the heuristic's config for head dims 64 and 128 (fp16, bf16), 256 (bf16), a windowed bf16 case and
    fp32, the dropout variants at each of the four dropout configs, the distance bias's, and the relative terms'
    (positions, c2p, p2c alone and together, with the bias, a window and dropout)."""
    specs = []
    cases = [("fp16", torch.float16, 64, False, False), ("bf16", torch.bfloat16, 64, True, False),
             ("bf16", torch.bfloat16, 128, False, False), ("fp16", torch.float16, 256, False, False),
             ("fp32", torch.float32, 64, False, False), ("fp32", torch.float32, 128, True, False),
             ("bf16", torch.bfloat16, 64, False, True), ("fp16", torch.float16, 128, True, True),
             ("bf16", torch.bfloat16, 256, False, True), ("fp32", torch.float32, 128, False, True)]
    cases = [c + (False,) for c in cases] + [  # the distance bias (MPNet's d64; windowed with dropout; fp32)
        ("fp16", torch.float16, 64, False, False, True), ("bf16", torch.bfloat16, 64, True, True, True),
        ("fp32", torch.float32, 64, False, False, True)]
    cases = [c + ("",) for c in cases] + [  # relative terms: positions (p), DeBERTa's c2p / p2c (c, q)
        ("fp16", torch.float16, 64, False, False, True, "p"), ("bf16", torch.bfloat16, 64, False, False, False, "cq"),
        ("fp16", torch.float16, 64, False, False, False, "pcq"),
        ("bf16", torch.bfloat16, 128, False, False, False, "c"), ("bf16", torch.bfloat16, 64, True, True, True, "pcq"),
        ("fp32", torch.float32, 64, False, False, False, "q"), ("fp32", torch.float32, 128, False, False, True, "pcq")]
    for cc in (90,):  # default_config does not depend on the GPU generation (yet): one config per case
        for tname, dtype, d, windowed, dropout, biased, rel in cases:
            cfg = default_config(d, dtype, cc, dropout, biased or bool(rel), "c" in rel or "q" in rel)
            ptr = "*" + tname
            ints = {"total": "i32", "n_tiles": "i32", "stride_t": "i32", "stride_h": "i32", "window_left": "i32",
                    "window_right": "i32", "qk_scale": "fp32", "scale": "fp32", "drop_key": "i32", "drop_thr": "i32",
                    "drop_scale": "fp32"}
            consts = {"D": d, "BLOCK_D": block_d(d), "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n,
                      "HAS_LEFT": windowed, "HAS_RIGHT": windowed, "IEEE": dtype == torch.float32,
                      "DROPOUT": dropout, "HAS_BIAS": biased, "HAS_POS": "p" in rel, "HAS_C2P": "c" in rel,
                      "HAS_P2C": "q" in rel}
            tag = (f"{tname}_d{d}{'_window' if windowed else ''}{'_dropout' if dropout else ''}"
                   f"{'_bias' if biased else ''}{'_rel' + rel if rel else ''}_cfg{cc}")
            rel_sig = {"POS": "*i32", "C2P": ptr, "P2C": ptr, "SLOT": "*i32"}
            launch = {"divisible_by_16": ["stride_t", "stride_h"], "num_warps": cfg.num_warps,
                      "num_stages": cfg.num_stages}
            sig_c = {k: "constexpr" for k in consts}
            specs.append({"name": f"attention_bwd_dkdv_{tag}", "fn": _attention_bwd_dkdv_kernel,
                          "signature": {"Q": ptr, "K": ptr, "V": ptr, "DO": ptr, "LSE": "*fp32", "DELTA": "*fp32",
                                        "DK": ptr, "DV": ptr, "CU": "*i32", **ints, "BIAS": "*fp32",
                                        "bias_len": "i32", **rel_sig, "DP2C": "*fp32", "slots": "i32", **sig_c},
                          "constexprs": consts, **launch})
            specs.append({"name": f"attention_bwd_dq_{tag}", "fn": _attention_bwd_dq_kernel,
                          "signature": {"Q": ptr, "K": ptr, "V": ptr, "DO": ptr, "LSE": "*fp32", "DELTA": "*fp32",
                                        "DQ": ptr, "CU": "*i32", **ints, "BIAS": "*fp32", "DBIAS": "*fp32",
                                        "bias_len": "i32", **rel_sig, "DC2P": "*fp32", "slots": "i32", **sig_c},
                          "constexprs": consts, **launch})
            if not windowed and not dropout and not biased and not rel:
                specs.append({"name": f"attention_bwd_preprocess_{tname}_d{d}_cfg{cc}",
                              "fn": _attention_bwd_preprocess_kernel,
                              "signature": {"O": ptr, "DO": ptr, "DELTA": "*fp32", "total": "i32",
                                            "stride_t": "i32", "stride_h": "i32", "D": "constexpr",
                                            "BLOCK_D": "constexpr", "BLOCK_T": "constexpr"},
                              "constexprs": {"D": d, "BLOCK_D": block_d(d), "BLOCK_T": 64},
                              "divisible_by_16": ["stride_t", "stride_h"], "num_warps": 4, "num_stages": 1})
    return specs
