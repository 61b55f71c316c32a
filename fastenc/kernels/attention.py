"""Triton fused bidirectional attention, FlashAttention-2 forward (Dao, 2023): one program per (query tile,
head, sequence) loops over the key tiles of its band with the online softmax, never materializing seq x seq.

Packed variable-length layout (FlashAttention's varlen convention): q, k, v, out (total_tokens, heads, head_dim),
cu_seqlens int32 (batch + 1,). A sliding window (left, right) restricts query i to keys i-left..i+right and the
loop to the tiles that intersect that band. fp16/bf16 operands go to tl.dot with fp32 accumulation (wgmma on
sm_90, mma on sm_80); fp32 operands use IEEE fp32 dots (no TF32) to meet the fp32 tolerance. Relative-position
terms (a distance bias lookup, per-token positions, DeBERTa's c2p / p2c through a per-distance slot lookup) are added
to the scores inside the tile loop, each behind a constexpr flag, so the plain kernel pays nothing for them.
"""
from __future__ import annotations

import json
import math
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl

from fastenc.kernels._attention_rel import _disentangled, _positions, check_relative
from fastenc.kernels._util import on_device
from fastenc.reference.attention_dropout import call_key, threshold

LOG2E = 1.4426950408889634


@triton.jit
def _mix32(x):
    # The dropout hash of fastenc/reference/attention_dropout.py on uint32 (wrapping multiplies, logical shifts):
    #   x ^= x >> 16; x *= 0x7FEB352D; x ^= x >> 15; x *= 0x846CA68B; x ^= x >> 16
    x = x ^ (x >> 16)
    x = x * tl.full((), 0x7FEB352D, tl.uint32)
    x = x ^ (x >> 15)
    x = x * tl.full((), 0x846CA68B, tl.uint32)
    return x ^ (x >> 16)


@triton.jit
def _dropout_row_keys(drop_key, h, tokens):
    # Row keys r = mix(c ^ mix(t ^ mix(h ^ G))) of head h and packed query tokens `tokens` (int32 vector); c = drop_key
    # (the call key, passed as int32 bits).
    hk = _mix32(h.to(tl.uint32) ^ tl.full((), 0x9E3779B9, tl.uint32))
    return _mix32(drop_key.to(tl.uint32, bitcast=True) ^ _mix32(tokens.to(tl.uint32) ^ hk))


@triton.jit
def _dropout_keep(rows, cols, drop_thr):
    # Keep-mask of the elements (row keys `rows` broadcast against key columns `cols`): u = mix(r + j * G),
    # kept when (u >> 1) >= floor(p * 2^31) = drop_thr.
    u = _mix32(rows + cols.to(tl.uint32) * tl.full((), 0x9E3779B9, tl.uint32))
    return (u >> 1).to(tl.int32) >= drop_thr


def dropout_args(dropout_p: float, seed: int, offset: int) -> tuple[int, int, float]:
    """(drop_key as int32 bits, drop_thr, drop_scale = 1/(1-p)) for the kernels' dropout arguments."""
    if dropout_p <= 0:
        return 0, 0, 1.0
    key = call_key(seed, offset)
    return key - (1 << 32) if key >= 1 << 31 else key, threshold(dropout_p), 1.0 / (1.0 - dropout_p)


@triton.jit
def _distance_bias(BIAS, bias_len, h, dist):
    # BIAS[h, dist + L - 1] * log2(e) for bias_len = 2L - 1 (fp32); indices outside [0, bias_len) read 0.
    idx = dist + (bias_len - 1) // 2
    ok = (idx >= 0) & (idx < bias_len)
    return tl.load(BIAS + h.to(tl.int64) * bias_len + idx, mask=ok, other=0.0) * 1.4426950408889634


def check_bias(bias: torch.Tensor | None, heads: int, max_seqlen: int, device) -> tuple[torch.Tensor | None, int]:
    """(the lookup contiguous, bias_len) or (None, 1); ValueError unless it is fp32 (heads, 2L - 1) with
    L >= max_seqlen on q's device."""
    if bias is None:
        return None, 1
    if (bias.dim() != 2 or bias.shape[0] != heads or bias.shape[1] % 2 == 0 or bias.dtype != torch.float32
            or bias.device != device):
        raise ValueError(f"attention (triton): bias must be float32 (heads={heads}, 2L - 1) on {device}, got "
                         f"{bias.dtype} {tuple(bias.shape)} on {bias.device}")
    if (bias.shape[1] + 1) // 2 < max_seqlen:
        raise ValueError(f"attention (triton): the distance bias covers sequences up to {(bias.shape[1] + 1) // 2} "
                         f"tokens, max_seqlen is {max_seqlen}")
    return bias.contiguous(), bias.shape[1]


@triton.jit
def _attention_fwd_kernel(Q, K, V, O, LSE, CU, total, m_blocks, stride_t, stride_h, window_left, window_right,
                          qk_scale, drop_key, drop_thr, drop_scale, BIAS, bias_len, POS, C2P, P2C, SLOT, slots,
                          D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, IEEE: tl.constexpr,
                          DROPOUT: tl.constexpr, HAS_BIAS: tl.constexpr = False, HAS_POS: tl.constexpr = False,
                          HAS_C2P: tl.constexpr = False, HAS_P2C: tl.constexpr = False):
    # Program (query tile m, sequence b) on grid axis 0 = m_blocks * batch (sequence-major, as the CUDA kernel:
    # grid y and z stop at 65,535), head h on axis 1. Base-2 online softmax over key tiles j, with
    # s = q.k * scale * log2(e) (so e^(scale q.k) = 2^s):
    #   m'   = max(m, rowmax(s_j))              running max
    #   p    = 2^(s_j - m'),  alpha = 2^(m - m')
    #   l    = alpha * l + rowsum(p)            running denominator
    #   acc  = alpha * acc + p @ v_j            running numerator (fp32)
    # out = acc / l. Keys outside the sequence or the window get s = -inf (p = 0).
    # lse = (m + log2 l) * ln 2, the natural log-sum-exp of scale * q.k the backward needs (+inf when l = 0),
    # stored at LSE[h * total + token] (fp32, (heads, total_tokens)).
    # DROPOUT (keep-mask Z of fastenc/reference/attention_dropout.py, from the row keys of the tile's queries and
    # the key columns): l sums the undropped p, acc takes p * Z, and out = acc / l * drop_scale (= 1/(1-p)), i.e.
    # out = (softmax * Z / (1-p)) V; lse is the undropped one.
    # HAS_BIAS (a distance bias lookup BIAS (heads, bias_len = 2L - 1) fp32): s_ij += BIAS[h, i - j + L - 1] * log2(e)
    # before the mask; an index outside the lookup reads nothing (the launcher checks L >= the longest sequence).
    # HAS_POS: the distance is POS[i] - POS[j] (per-token positions clamped to [0, L)) instead of i - j.
    # HAS_C2P / HAS_P2C (DeBERTa's disentangled terms, fastenc/kernels/_attention_rel.py; bias_len is then the
    # common length 2L - 1 of BIAS and the slot lookup SLOT): s_ij += (C2P[i, h, slot] + P2C[j, h, slot]) * log2(e).
    pid = tl.program_id(0)
    b = pid // m_blocks
    pid_m = pid - b * m_blocks
    h = tl.program_id(1)
    # cu_seqlens is bounds-checked where it is read: 0 <= start <= end <= total whatever the tensor holds, so no
    # load or store leaves rows [0, total).
    start = tl.minimum(tl.maximum(tl.load(CU + b), 0), total)
    seqlen = tl.minimum(tl.maximum(tl.load(CU + b + 1), start), total) - start
    m0 = pid_m * BLOCK_M
    if m0 >= seqlen:
        return
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < seqlen
    d_ok = offs_d < D
    base = start.to(tl.int64) * stride_t + h * stride_h
    q = tl.load(Q + base + offs_m[:, None].to(tl.int64) * stride_t + offs_d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)

    # The band of keys any row of this tile can see.
    lo = 0
    hi = seqlen
    if HAS_LEFT:
        lo = tl.maximum(m0 - window_left, 0)
        lo = (lo // BLOCK_N) * BLOCK_N  # tile-aligned starts keep the loads aligned
    if HAS_RIGHT:
        hi = tl.minimum(m0 + BLOCK_M + window_right, seqlen)

    if DROPOUT:
        rkeys = _dropout_row_keys(drop_key, h, start + offs_m)
    pos_m = offs_m
    if HAS_POS:
        pos_m = _positions(POS, start + offs_m, row_ok, bias_len)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for n0 in range(lo, hi, BLOCK_N):
        cols = n0 + offs_n
        col_ok = cols < hi
        kt = tl.load(K + base + cols[None, :].to(tl.int64) * stride_t + offs_d[:, None],
                     mask=col_ok[None, :] & d_ok[:, None], other=0.0)  # (BLOCK_D, BLOCK_N)
        if IEEE:
            s = tl.dot(q, kt, input_precision="ieee")
        else:
            s = tl.dot(q, kt)
        s = s * qk_scale
        if HAS_BIAS or HAS_C2P or HAS_P2C:
            if HAS_POS:
                dist = pos_m[:, None] - _positions(POS, start + cols, col_ok, bias_len)[None, :]
            else:
                dist = pos_m[:, None] - cols[None, :]
        if HAS_BIAS:
            s += _distance_bias(BIAS, bias_len, h, dist)
        if HAS_C2P or HAS_P2C:
            rel, _ = _disentangled(C2P, P2C, SLOT, bias_len, slots, h, start + offs_m[:, None], start + cols[None, :],
                                   dist, row_ok[:, None] & col_ok[None, :], HAS_C2P, HAS_P2C)
            s += rel
        keep = col_ok[None, :]
        if HAS_LEFT:
            keep = keep & (cols[None, :] >= offs_m[:, None] - window_left)
        if HAS_RIGHT:
            keep = keep & (cols[None, :] <= offs_m[:, None] + window_right)
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet: keep p = 0, no NaN
        p = tl.math.exp2(s - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        if DROPOUT:
            p = tl.where(_dropout_keep(rkeys[:, None], cols[None, :], drop_thr), p, 0.0)
        v = tl.load(V + base + cols[:, None].to(tl.int64) * stride_t + offs_d[None, :],
                    mask=col_ok[:, None] & d_ok[None, :], other=0.0)  # (BLOCK_N, BLOCK_D)
        acc = acc * alpha[:, None]
        if IEEE:
            acc += tl.dot(p, v, input_precision="ieee")
        else:
            acc += tl.dot(p.to(v.dtype), v)
        m_i = m_new
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    out = acc / l_safe[:, None]
    if DROPOUT:
        out = out * drop_scale
    tl.store(O + base + offs_m[:, None].to(tl.int64) * stride_t + offs_d[None, :], out.to(O.dtype.element_ty),
             mask=row_ok[:, None] & d_ok[None, :])
    lse = tl.where(l_i > 0.0, (m_i + tl.math.log2(l_safe)) * 0.6931471805599453, float("inf"))
    tl.store(LSE + h.to(tl.int64) * total + start + offs_m, lse, mask=row_ok)


def block_d(head_dim: int) -> int:
    """The head dim padded to a power of two, at least 16: tl.dot needs K >= 16 on NVIDIA GPUs (the masks zero
    the padding)."""
    return max(16, triton.next_power_of_2(head_dim))


GRID_Y_MAX = 65535  # CUDA's limit on grid y and z (x goes to 2**31 - 1)


def launch_grid(max_seqlen: int, total: int, batch: int, heads: int, block_m: int) -> tuple[int, int]:
    """(m_blocks, grid): m_blocks query tiles per sequence, from the longest length (capped by total: no sequence
    is longer), grid (m_blocks * batch, heads)."""
    m_blocks = triton.cdiv(max(1, min(max_seqlen, total)), block_m)
    if heads > GRID_Y_MAX:
        raise ValueError(f"attention (triton): heads must be <= {GRID_Y_MAX}, got {heads}")
    if m_blocks * batch > 2 ** 31 - 1:
        raise ValueError(f"attention (triton): {batch} sequences x {m_blocks} query tiles exceed the grid "
                         f"(2**31 - 1 programs)")
    return m_blocks, (m_blocks * batch, heads)


@dataclass(frozen=True)
class AttentionConfig:
    """Launch configuration of _attention_fwd_kernel."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def default_config(head_dim: int, dtype: torch.dtype, cc: int | None, biased: bool = False,
                   disentangled: bool = False) -> AttentionConfig:
    """Analytical choice per head dim and GPU generation (cc = major*10+minor; None = CPU interpreter).

    The fp32 accumulator (BLOCK_M x BLOCK_D) and the q tile live in registers: wide heads get shorter query
    tiles so nothing spills; sm_90 has the shared memory for deeper K/V pipelines than sm_80. biased: a distance
    bias or positions; disentangled: c2p / p2c too (their gathers' registers: lighter fp32 tiles).
    """
    bd = block_d(head_dim)
    masked = head_dim != bd  # a live head-dim mask (unaligned rows) costs registers: lighter tiles
    if cc is None:  # interpreter: few large tiles (its cost grows with the number of tile steps)
        return AttentionConfig(64, 64, 4, 1)
    if disentangled and dtype == torch.float32 and bd <= 128:  # 64 x 16 x 2 stages / 16 x 16 x 2 spilled 4-12 B
        return AttentionConfig(64, 16, 8, 1) if bd <= 64 else AttentionConfig(16, 16, 4, 1)
    if biased and dtype != torch.float32 and bd <= 128:  # the bias gather tile: 128 x 64 spilled once windowed
        return AttentionConfig(128, 32, 8, 2)
    if dtype == torch.float32:  # IEEE fp32 dots: twice the register and shared-memory footprint
        if bd <= 64:  # 64 x 16 key tiles: 64 x 32 spilled 4 B at head dim 32 on sm_80 once the lse store came in
            return AttentionConfig(64, 16, 8, 2)
        return AttentionConfig(16, 16, 4, 2) if bd <= 128 else AttentionConfig(32, 16, 8, 1)
    if bd > 128:  # head dims 136..256: the fp32 accumulator needs 8 warps' registers
        return AttentionConfig(32, 16, 4, 2) if masked else AttentionConfig(64, 32, 8, 2)
    if cc >= 90:
        if bd <= 64:
            return AttentionConfig(128, 64, 8, 3) if masked else AttentionConfig(128, 128, 8, 3)
        return AttentionConfig(128, 64, 8, 2)
    if bd <= 64:
        return AttentionConfig(128, 64, 8, 3)
    return AttentionConfig(128, 32, 8, 2)


def candidate_configs(head_dim: int, dtype: torch.dtype, cc: int) -> list[AttentionConfig]:
    """The autotuning space, filtered to what fits (keep() in the spirit of Triton's tutorial 06)."""
    bd = block_d(head_dim)
    out = []
    for bm in (64, 128):
        for bn in (32, 64, 128):
            for warps in (4, 8):
                for stages in (1, 2, 3):
                    elems = bm * bd + 2 * bn * bd * stages  # rough register + shared footprint
                    if dtype == torch.float32 and bm * bd > 64 * 64 * 2:
                        continue
                    if elems <= 128 * 256 + 2 * 128 * 128 * 3 and not (bm == 128 and warps == 4 and bd > 64):
                        out.append(AttentionConfig(bm, bn, warps, stages))
    return out


_CACHE_LOCK = threading.Lock()
_TUNED: dict[str, AttentionConfig] | None = None


def _cache_path() -> Path:
    base = Path(os.environ.get("FASTENC_CACHE_DIR", Path.home() / ".cache" / "fastenc"))
    return base / "attention_autotune.json"


def _load_tuned() -> dict[str, AttentionConfig]:
    global _TUNED
    if _TUNED is None:
        _TUNED = {}
        try:
            for key, cfg in json.loads(_cache_path().read_text()).items():
                _TUNED[key] = AttentionConfig(**cfg)
        except (OSError, ValueError, TypeError):
            pass
    return _TUNED


def _autotune(key: str, run, head_dim: int, dtype: torch.dtype, cc: int) -> AttentionConfig:
    """Time every candidate on the actual inputs once (triton.testing.do_bench) and cache the winner on disk."""
    best, best_ms = None, math.inf
    for cfg in candidate_configs(head_dim, dtype, cc):
        try:
            ms = triton.testing.do_bench(lambda: run(cfg), warmup=5, rep=20)
        except Exception:  # out of resources for this GPU: not a candidate
            continue
        if ms < best_ms:
            best, best_ms = cfg, ms
    best = best or default_config(head_dim, dtype, cc)
    with _CACHE_LOCK:
        tuned = _load_tuned()
        tuned[key] = best
        path = _cache_path()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({k: asdict(v) for k, v in tuned.items()}, indent=1))
            tmp.replace(path)
        except OSError:
            pass
    return best


def _choose(q: torch.Tensor, max_seqlen: int, windowed: bool, run, biased: bool = False,
            disentangled: bool = False) -> AttentionConfig:
    d = q.shape[-1]
    if not q.is_cuda:
        return default_config(d, q.dtype, None)
    major, minor = torch.cuda.get_device_capability(q.device)
    cc = major * 10 + minor
    if os.environ.get("FASTENC_AUTOTUNE", "0") in ("", "0"):
        return default_config(d, q.dtype, cc, biased, disentangled)
    key = f"sm{cc}|{str(q.dtype).replace('torch.', '')}|d{d}|s{triton.next_power_of_2(max(max_seqlen, 16))}|w{int(windowed)}"
    key += ("|bias" if biased else "") + ("|c2p" if disentangled else "")
    tuned = _load_tuned().get(key)
    return tuned if tuned is not None else _autotune(key, run, d, q.dtype, cc)


def attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                  window_left: int, window_right: int, scale: float, dropout_p: float = 0.0, seed: int = 0,
                  offset: int = 0, bias: torch.Tensor | None = None, positions: torch.Tensor | None = None,
                  c2p: torch.Tensor | None = None, p2c: torch.Tensor | None = None, slot: torch.Tensor | None = None,
                  config: AttentionConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k, v: (total_tokens, heads, head_dim) contiguous fp16/bf16/fp32; cu_seqlens int32 (batch + 1,);
    window -1 = unbounded; dropout_p > 0: attention dropout with the keep-mask of (seed, offset). Returns (out like q, lse (heads, total_tokens) fp32). `config` overrides the
    heuristic / autotuned choice. max_seqlen must be >= every length (it sizes the grid; fastenc.ops.attention
    passes the longest it read). Memory-safe with any cu_seqlens values: the kernel clamps them to
    [0, total_tokens]. bias: a distance lookup (heads, 2L - 1) fp32, L >= max_seqlen (fastenc/ops/attention.py).
    positions: int32 (total_tokens,), each token's position for the relative terms (read clamped to [0, L)).
    c2p, p2c: DeBERTa's disentangled terms (total_tokens, heads, slots) in q's dtype, read through slot, the
    per-distance slot lookup int32 (2L - 1,) (fastenc/kernels/_attention_rel.py); no extra memory."""
    total, heads, d = q.shape
    out = torch.empty_like(q)
    lse = torch.empty((heads, total), dtype=torch.float32, device=q.device)
    batch = cu_seqlens.numel() - 1
    if total == 0 or batch == 0:
        return out.zero_(), lse.fill_(float("inf"))
    cu = cu_seqlens.to(device=q.device, dtype=torch.int32).contiguous()
    # A window side >= total_tokens bounds nothing; the others stay below it, and with total <= 2**30 the
    # kernel's int32 sums (row + window) cannot overflow.
    wl = -1 if window_left < 0 or window_left >= total else int(window_left)
    wr = -1 if window_right < 0 or window_right >= total else int(window_right)
    if total > (2 ** 30 if wl >= 0 or wr >= 0 else 2 ** 31 - 1):
        bound = "2**30 with a window" if wl >= 0 or wr >= 0 else "2**31 - 1"
        raise ValueError(f"attention (triton): total_tokens must be <= {bound}, got {total}")

    drop = dropout_args(dropout_p, seed, offset)
    bias, bias_len = check_bias(bias, heads, max_seqlen, q.device)
    rel = check_relative(q, bias, bias_len, max_seqlen, positions, c2p, p2c, slot)

    def run(cfg: AttentionConfig) -> None:
        m_blocks, grid = launch_grid(max_seqlen, total, batch, heads, cfg.block_m)
        _attention_fwd_kernel[grid](
            q, k, v, out, lse, cu, total, m_blocks, heads * d, d, max(wl, 0), max(wr, 0), scale * LOG2E, *drop,
            lse if bias is None else bias, rel.rel_len, *rel.pointers(cu, q),
            D=d, BLOCK_D=block_d(d), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
            HAS_LEFT=wl >= 0, HAS_RIGHT=wr >= 0, IEEE=q.dtype == torch.float32, DROPOUT=dropout_p > 0,
            HAS_BIAS=bias is not None, **rel.flags(), num_warps=cfg.num_warps, num_stages=cfg.num_stages)

    with on_device(q):
        cfg = config or _choose(q, max_seqlen, wl >= 0 or wr >= 0, run, bias is not None or rel.any,
                                rel.slot is not None)
        run(cfg)
    return out, lse


def compile_specs() -> list[dict]:
    """Ahead-of-time compile configurations (see fastenc/kernels/_compile.py; each is compiled for sm_90 and sm_80): the
    heuristic's launch configs over every BLOCK_D the backend can get (head dims 8..256, multiples of 8 -> 16,
    32, 64, 128, 256), fp16 and bf16 with the sm_90 and sm_80 choices, fp32, ModernBERT's windowed bf16
    case, the dropout variants of three of them, the distance bias's, and the relative terms' (positions, c2p, p2c,
    alone and together, with the bias, a window and dropout). Head dims that are not a power of two (8, 24, 40, 80, 200)
    exercise the head-dim mask and its configs."""
    specs = []
    cases = [("fp16", torch.float16, 8, False, 90), ("bf16", torch.bfloat16, 24, False, 90),
             ("fp16", torch.float16, 40, False, 90), ("fp16", torch.float16, 64, False, 90),
             ("bf16", torch.bfloat16, 64, False, 80), ("bf16", torch.bfloat16, 80, False, 90),
             ("fp16", torch.float16, 128, False, 80), ("bf16", torch.bfloat16, 128, False, 90),
             ("fp16", torch.float16, 256, False, 90), ("bf16", torch.bfloat16, 200, False, 80),
             ("bf16", torch.bfloat16, 64, True, 90), ("bf16", torch.bfloat16, 64, True, 80),
             ("fp32", torch.float32, 8, False, 90), ("fp32", torch.float32, 32, False, 80),
             ("fp32", torch.float32, 64, False, 90), ("fp32", torch.float32, 128, False, 80),
             ("fp32", torch.float32, 200, False, 90), ("fp32", torch.float32, 256, False, 90)]
    cases = [c + (False, False) for c in cases] + [  # the dropout variants: ModernBERT's, the widest head, fp32
        ("bf16", torch.bfloat16, 64, True, 80, True, False), ("fp16", torch.float16, 256, False, 90, True, False),
        ("fp32", torch.float32, 128, False, 80, True, False)] + [  # the distance bias (MPNet: d64; windowed)
        ("fp16", torch.float16, 64, False, 90, False, True), ("bf16", torch.bfloat16, 64, True, 90, False, True),
        ("fp32", torch.float32, 64, False, 80, False, True)]
    cases = [c + ("",) for c in cases] + [  # relative terms: positions (p), DeBERTa's c2p / p2c (c, q)
        ("fp16", torch.float16, 64, False, 90, False, True, "p"),
        ("bf16", torch.bfloat16, 64, False, 90, False, False, "cq"),
        ("fp16", torch.float16, 64, False, 80, False, False, "pcq"),
        ("bf16", torch.bfloat16, 128, False, 90, False, False, "q"),
        ("bf16", torch.bfloat16, 64, True, 80, True, True, "pcq"),
        ("fp32", torch.float32, 64, False, 90, False, False, "c"),
        ("fp32", torch.float32, 128, False, 80, False, True, "pcq")]
    for tname, dtype, d, windowed, cc, dropout, biased, rel in cases:
        cfg = default_config(d, dtype, cc, biased or bool(rel), "c" in rel or "q" in rel)
        ptr = "*" + tname
        specs.append({
            "name": f"attention_{tname}_d{d}{'_window' if windowed else ''}{'_dropout' if dropout else ''}"
                    f"{'_bias' if biased else ''}{'_rel' + rel if rel else ''}_cfg{cc}",
            "fn": _attention_fwd_kernel,
            "signature": {"Q": ptr, "K": ptr, "V": ptr, "O": ptr, "LSE": "*fp32", "CU": "*i32", "total": "i32",
                          "m_blocks": "i32", "stride_t": "i32", "stride_h": "i32", "window_left": "i32",
                          "window_right": "i32", "qk_scale": "fp32", "drop_key": "i32", "drop_thr": "i32",
                          "drop_scale": "fp32", "BIAS": "*fp32", "bias_len": "i32", "POS": "*i32", "C2P": ptr,
                          "P2C": ptr, "SLOT": "*i32", "slots": "i32", "D": "constexpr",
                          "BLOCK_D": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr",
                          "HAS_LEFT": "constexpr", "HAS_RIGHT": "constexpr", "IEEE": "constexpr",
                          "DROPOUT": "constexpr", "HAS_BIAS": "constexpr", "HAS_POS": "constexpr",
                          "HAS_C2P": "constexpr", "HAS_P2C": "constexpr"},
            "constexprs": {"D": d, "BLOCK_D": block_d(d), "BLOCK_M": cfg.block_m,
                           "BLOCK_N": cfg.block_n, "HAS_LEFT": windowed, "HAS_RIGHT": windowed,
                           "IEEE": dtype == torch.float32, "DROPOUT": dropout, "HAS_BIAS": biased,
                           "HAS_POS": "p" in rel, "HAS_C2P": "c" in rel, "HAS_P2C": "q" in rel},
            "divisible_by_16": ["stride_t", "stride_h"] if d % 16 == 0 else [],
            "num_warps": cfg.num_warps,
            "num_stages": cfg.num_stages,
        })
    return specs
