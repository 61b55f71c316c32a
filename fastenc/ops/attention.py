"""fastenc.ops.attention: fused bidirectional attention — padded, variable-length (cu_seqlens), sliding window.

Every backend implements one contract, the packed variable-length form (FlashAttention's varlen convention):
  fn(q, k, v, cu_seqlens, max_seqlen, window_left, window_right, scale) -> (out, lse)
  q, k, v: (total_tokens, heads, head_dim); cu_seqlens: int32 (batch+1,); window -1 = unbounded;
  lse: (heads, total_tokens) fp32, the natural log-sum-exp of each query row's scaled scores (+inf for a row with
  no visible key), the one thing besides out the backward needs (FlashAttention-2 saves the same).
With attention dropout (dropout_p > 0) a backend is called with three more arguments,
  fn(..., scale, dropout_p, seed, offset)
and applies the keep-mask of fastenc/reference/attention_dropout.py (a pure function of seed, offset and the
element's counters) to the normalized probabilities, scaling kept ones by 1/(1-p); lse is unchanged. At
dropout_p = 0 no backend gets those arguments and no random number is drawn.
With a distance bias (relative-position buckets and/or ALiBi, fastenc/reference/attention_bias.py) a backend is
called with one more,
  fn(..., scale, dropout_p, seed, offset, bias)
bias: (heads, 2 * L - 1) fp32, L >= the longest sequence, and score(i, j) += bias[h, i - j + L - 1] for query i
and key j of one sequence (positions within the sequence). The lookup is built per call from the caller's table
or slopes (O(L) memory; no backend materializes a (seq, seq) tensor except the reference); its gradient flows
back to the table / slopes through torch's autograd of that lookup. A backend without the bias declares it.
The backward (fastenc::attention_bwd, one Impl per backend) recomputes the probabilities tile by tile from lse
(and the keep-mask from seed and offset).
Strides: q, k, v may be views with a row stride (e.g. the column blocks of one QKV GEMM's (tokens, 3 * hidden)
output). The cpu kernels read fp32 views with one row stride, heads head_dim apart, in place; the Triton and CUDA
backends are registered behind `contiguous_args`, which copies what is not contiguous (their kernels assume it);
the reference takes any strides. fastenc.ops.attention_qkv takes the fused buffer itself and gets its gradient
back in one buffer.
The padded layout is served through it: without a mask as a free view, with a mask by unpadding once and
re-padding the output (padded query rows are zero).
Per-token positions and DeBERTa's disentangled terms (fastenc/reference/attention_relative.py) extend the bias
call: whenever any relative term is present a backend gets all of them, positionally, None when absent,
  fn(..., scale, dropout_p, seed, offset, bias, positions, c2p, p2c, slot) -> (out, lse)
positions int32 (total_tokens,) (None: the index within the sequence); c2p, p2c (total_tokens, heads, slots) in q's
dtype, contiguous; slot int32 (2L - 1,) the per-distance slot lookup, given iff c2p or p2c is; L = (len of bias or
slot + 1) // 2, and every position lies in [0, L). A backend without positions or the disentangled terms says so
in its check ("no positions", "no disentangled terms").
"""
from __future__ import annotations

import math
import operator

import torch

from fastenc import registry
from fastenc.registry import _dt
from fastenc.ops import _backends
from fastenc.ops._common import (INT64_MAX as _INT64_MAX, check_cu_seqlens, check_float, draw_seed_offset,
                                 needs_grad)
from fastenc.ops._attention_bwd import (  # also registers attention_bwd
    _bwd_inputs, _cpu_check, _head_dim, _triton_check, backward, contiguous_args, legacy_bias_fwd, no_relative,
    setup_context)
from fastenc.ops._library import custom_op
from fastenc.padding import pad_input, unpad_input
from fastenc.reference.attention import attention_varlen_ref
from fastenc.reference.attention_bias import distance_bias
from fastenc.reference.attention_bwd import attention_lse_varlen_ref
from fastenc.reference.attention_relative import slot_lookup

OP = "attention"
OP_BWD = "attention_bwd"


def _reference(q, k, v, cu_seqlens, max_seqlen, window_left, window_right, scale, dropout_p=0.0, seed=0, offset=0,
               bias=None, positions=None, c2p=None, p2c=None, slot=None):
    window = (window_left, window_right)
    rel = dict(bias=bias, positions=positions, c2p=c2p, p2c=p2c, slot=slot)
    out = attention_varlen_ref(q, k, v, cu_seqlens, window, scale, dropout_p=dropout_p, seed=seed, offset=offset,
                               **rel)
    return out, attention_lse_varlen_ref(q, k, cu_seqlens, window, scale, **rel).float()


@custom_op("fastenc::attention", mutates_args=())
def _attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                  window_left: int, window_right: int, scale: float, backend: str, dropout_p: float = 0.0,
                  seed: int = 0, offset: int = 0, bias: torch.Tensor | None = None,
                  positions: torch.Tensor | None = None, c2p: torch.Tensor | None = None,
                  p2c: torch.Tensor | None = None,
                  slot: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    fn = registry.impl(OP, backend).fn
    rel = (bias, positions, c2p, p2c, slot)
    if any(t is not None for t in rel):
        return fn(q, k, v, cu_seqlens, max_seqlen, window_left, window_right, scale, dropout_p, seed, offset, *rel)
    if dropout_p > 0:
        return fn(q, k, v, cu_seqlens, max_seqlen, window_left, window_right, scale, dropout_p, seed, offset)
    return fn(q, k, v, cu_seqlens, max_seqlen, window_left, window_right, scale)


@_attention_op.register_fake
def _(q, k, v, cu_seqlens, max_seqlen, window_left, window_right, scale, backend, dropout_p=0.0, seed=0, offset=0,
      bias=None, positions=None, c2p=None, p2c=None, slot=None):
    return torch.empty_like(q), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


_backends.implement(OP, "reference", _reference)
_attention_op.register_autograd(backward, setup_context)  # fastenc/ops/_attention_bwd.py


_backends.implement(OP, "triton", "fastenc.kernels.attention", "attention_fwd",
                    check=lambda inputs: _triton_check(inputs) + no_relative(inputs),
                    wrap=lambda fn: contiguous_args(3)(legacy_bias_fwd(fn)),
                    limits="head_dim multiple of 8 <= 256; distance bias; contiguous q, k, v (copied if not); CUDA, CPU tensors "
                        "under TRITON_INTERPRET=1")
_backends.implement(OP, "cpu", "attention", check=_cpu_check,
                    limits="head_dim <= 256, fp32 math; distance bias, positions, c2p/p2c; fp32 q, k, v read in place "
                           "with one row stride")


def _cuda_check(inputs) -> list[str]:
    d = _head_dim(inputs)
    why = [] if d in (32, 64, 96, 128) else [f"head_dim must be 32, 64, 96 or 128, got {d}"]
    return why + (["dropout_p > 0 not supported"] if inputs.get("dropout_p", 0.0) > 0 else []) + no_relative(inputs)


_backends.implement(OP, "cuda", "attention_cuda", dtypes=(torch.float16, torch.bfloat16), check=_cuda_check,
                    wrap=lambda fn: contiguous_args(3)(legacy_bias_fwd(fn)), limits="fp16/bf16, head_dim 32/64/96/128; distance bias; contiguous q, k, v (copied if not); "
                                               "FlashAttention-2 on tensor cores (sm_80+)")


def _dropout_p(dropout_p) -> float:
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) or not 0 <= dropout_p < 1:
        raise ValueError(f"{OP}: dropout_p must be a float with 0 <= dropout_p < 1, got {dropout_p!r}")
    return float(dropout_p)


def _check_generator(generator) -> None:
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"{OP}: generator must be a torch.Generator or None, got {type(generator).__name__}")


def _window(window) -> tuple[int, int]:
    """window -> (left, right), -1 = unbounded (None, -1, or a -1 side: FlashAttention's convention)."""
    if window is None:
        return -1, -1
    if isinstance(window, bool):
        raise TypeError(f"{OP}: window must be an int or a (left, right) pair, got bool")
    if isinstance(window, int):
        left = right = window
    elif isinstance(window, (tuple, list)) and len(window) == 2 and all(isinstance(w, int) and not isinstance(w, bool) for w in window):
        left, right = window
    else:
        raise TypeError(f"{OP}: window must be an int or a (left, right) pair of ints, got {window!r}")
    if left < -1 or right < -1:
        raise ValueError(f"{OP}: window sizes must be >= 0, or -1 for unbounded, got (left={left}, right={right})")
    if left > _INT64_MAX or right > _INT64_MAX:
        raise ValueError(f"{OP}: window sizes must be at most 2**63-1, got (left={left}, right={right})")
    return int(left), int(right)


def check_distance_bias(q, relative_bias, relative_max_distance, alibi_slopes, op: str = OP) -> bool:
    """Validates the distance-bias arguments against q (..., heads, head_dim); True when a bias is given."""
    heads = q.shape[-2] if q.dim() >= 2 else -1
    if relative_bias is not None:
        if not isinstance(relative_bias, torch.Tensor) or relative_bias.dtype != torch.float32:
            raise TypeError(f"{op}: relative_bias must be a float32 tensor, got "
                            f"{getattr(relative_bias, 'dtype', type(relative_bias).__name__)}")
        if relative_bias.dim() != 2 or relative_bias.shape[1] != heads:
            raise ValueError(f"{op}: relative_bias must be (num_buckets, heads={heads}), got "
                             f"{tuple(relative_bias.shape)}")
        nb = relative_bias.shape[0]
        if nb < 4 or nb % 2:
            raise ValueError(f"{op}: relative_bias must have an even number of buckets >= 4, got {nb}")
        if isinstance(relative_max_distance, bool) or not isinstance(relative_max_distance, int) \
                or relative_max_distance <= nb // 4:
            raise ValueError(f"{op}: relative_max_distance must be an int > num_buckets // 4 = {nb // 4}, got "
                             f"{relative_max_distance!r}")
        if relative_bias.device != q.device:
            raise ValueError(f"{op}: relative_bias must be on {q.device}, got {relative_bias.device}")
    if alibi_slopes is not None:
        if not isinstance(alibi_slopes, torch.Tensor) or alibi_slopes.dtype != torch.float32:
            raise TypeError(f"{op}: alibi_slopes must be a float32 tensor, got "
                            f"{getattr(alibi_slopes, 'dtype', type(alibi_slopes).__name__)}")
        if alibi_slopes.dim() != 1 or alibi_slopes.shape[0] != heads:
            raise ValueError(f"{op}: alibi_slopes must be (heads={heads},), got {tuple(alibi_slopes.shape)}")
        if alibi_slopes.device != q.device:
            raise ValueError(f"{op}: alibi_slopes must be on {q.device}, got {alibi_slopes.device}")
    return relative_bias is not None or alibi_slopes is not None


def _int_arg(name: str, value, op: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{op}: {name} must be an int >= {low}, got {value!r}")
    return int(value)


def check_disentangled(q, c2p, p2c, rel_span, position_buckets, max_relative_positions, lead: tuple[int, ...],
                       op: str = OP) -> tuple[int, int, int] | None:
    """Validates DeBERTa's c2p / p2c against q (lead + (heads, head_dim)): each None or (*lead, heads, 2 * rel_span)
    in q's dtype on q's device. Returns (rel_span, position_buckets, max_relative_positions) when either is given,
    else None."""
    if c2p is None and p2c is None:
        return None
    span = _int_arg("rel_span", rel_span, op, 1)
    if isinstance(position_buckets, bool) or not isinstance(position_buckets, int):
        raise ValueError(f"{op}: position_buckets must be an int (<= 0: no log buckets), got {position_buckets!r}")
    buckets, maxrel = int(position_buckets), -1
    if buckets > 0:
        if buckets < 2:
            raise ValueError(f"{op}: position_buckets must be >= 2 (or <= 0 for no log buckets), got {buckets}")
        maxrel = _int_arg("max_relative_positions", max_relative_positions, op, buckets // 2 + 2)
    want = (*lead, q.shape[-2], 2 * span)
    for name, t in (("c2p", c2p), ("p2c", p2c)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or t.dtype != q.dtype:
            raise TypeError(f"{op}: {name} must be a tensor of q's dtype {_dt(q.dtype)}, got "
                            f"{_dt(t.dtype) if isinstance(t, torch.Tensor) else type(t).__name__}")
        if tuple(t.shape) != want:
            raise ValueError(f"{op}: {name} must have shape {want} (tokens, heads, 2 * rel_span={2 * span}), got "
                             f"{tuple(t.shape)}")
        if t.device != q.device:
            raise ValueError(f"{op}: {name} must be on {q.device}, got {t.device}")
    return span, buckets, maxrel


def check_positions(positions, lead: tuple[int, ...], device, op: str = OP) -> torch.Tensor:
    """positions: int32/int64 of shape `lead`, on `device` -> int32 (values are checked by positions_reach)."""
    if not isinstance(positions, torch.Tensor) or positions.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{op}: positions must be an int32 or int64 tensor, got "
                        f"{_dt(positions.dtype) if isinstance(positions, torch.Tensor) else type(positions).__name__}")
    if tuple(positions.shape) != tuple(lead):
        raise ValueError(f"{op}: positions must have shape {tuple(lead)}, got {tuple(positions.shape)}")
    if positions.device != torch.device(device):
        raise ValueError(f"{op}: positions must be on {device}, got {positions.device}")
    return positions


POSITIONS_MAX = 2 ** 24  # positions beyond this would make the O(L) lookups absurd (and int32 indices overflow)


def _validate_positions(positions: torch.Tensor, op: str) -> int:
    """positions.max() + 1 after checking every value lies in [0, POSITIONS_MAX) (0 for no tokens)."""
    if positions.numel() == 0:
        return 0
    lo, hi = (int(x) for x in torch.aminmax(positions))
    if lo < 0 or hi >= POSITIONS_MAX:
        raise ValueError(f"{op}: positions must lie in [0, {POSITIONS_MAX}), got values in [{lo}, {hi}]")
    return hi + 1


@custom_op("fastenc::positions_reach", mutates_args=())
def _positions_reach_op(positions: torch.Tensor, op: str) -> torch.Tensor:
    """positions -> (1,) int64 holding positions.max() + 1, after _validate_positions."""
    return torch.tensor([_validate_positions(positions, op)], dtype=torch.int64)


@_positions_reach_op.register_fake
def _(positions, op):
    return torch.empty(1, dtype=torch.int64)


def positions_reach(positions: torch.Tensor, op: str = OP) -> int:
    """max(positions) + 1 (the values checked: ValueError naming positions). Under torch.compile the check runs in
    the graph (fastenc::positions_reach) and the result is a symbolic int."""
    if not torch.compiler.is_compiling():
        return _validate_positions(positions, op)
    n = _positions_reach_op(positions, op).tolist()[0]
    torch._check(n >= 0)
    torch._check(n <= POSITIONS_MAX)
    return n


def _holes(key_padding_mask: torch.Tensor) -> bool:
    """Whether some row of the mask is not one contiguous run of real tokens."""
    m = key_padding_mask.to(torch.int8)
    starts = (m[:, 1:] > m[:, :-1]).sum(1) + m[:, 0]
    return bool((starts > 1).any())


def _max_seqlen(max_seqlen) -> int | None:
    """The caller's bound on the longest sequence as an int (None: none given); check_cu_seqlens compares it."""
    if max_seqlen is None:
        return None
    try:
        if isinstance(max_seqlen, (bool, torch.Tensor)):
            raise TypeError
        n = operator.index(max_seqlen)
    except TypeError:
        raise TypeError(f"{OP}: max_seqlen must be an int, got {type(max_seqlen).__name__}") from None
    return n


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, key_padding_mask: torch.Tensor | None = None,
              cu_seqlens: torch.Tensor | None = None, max_seqlen: int | None = None, window=None,
              scale: float | None = None, dropout_p: float = 0.0, generator: torch.Generator | None = None,
              relative_bias: torch.Tensor | None = None, relative_max_distance: int = 128,
              alibi_slopes: torch.Tensor | None = None, positions: torch.Tensor | None = None,
              c2p: torch.Tensor | None = None, p2c: torch.Tensor | None = None, rel_span: int | None = None,
              position_buckets: int = 0, max_relative_positions: int | None = None,
              backend: str | None = None) -> torch.Tensor:
    """Non-causal attention: every query sees every key of its own sequence (within `window`, if given).

    Padded:  q, k, v (batch, seq, heads, head_dim); key_padding_mask (batch, seq) bool, True = real token.
             Output rows at padded query positions are zero.
    Packed:  q, k, v (total_tokens, heads, head_dim); cu_seqlens int32 (batch+1,); max_seqlen >= longest.
    window:  int (each side) or (left, right): query i sees keys i-left..i+right of its sequence; -1 (or any
             size >= the sequence) leaves that side unbounded.
    scale:   defaults to 1/sqrt(head_dim). fp32/fp16/bf16, fp32 accumulation. Returns q's shape and dtype.
    dropout_p: attention-probability dropout (training): each normalized probability is zeroed with probability
             dropout_p and the kept ones scaled by 1/(1 - dropout_p), as transformers' eager / sdpa attention in
             training mode. 0 <= dropout_p < 1. The keep-mask is a pure function of (seed, offset) drawn from
             `generator` (default: torch's default CPU generator whatever q's device, so no device
             synchronization) and of each element's position (fastenc/reference/attention_dropout.py); the
             backward regenerates it. 0: no dropout, nothing drawn.
    relative_bias: (num_buckets, heads) fp32, a bucketed relative-position table (trainable: it gets a gradient):
             score(i, j) += relative_bias[bucket(j - i), h] with T5's bidirectional log buckets exactly as
             transformers' MPNet (relative_position = key position - query position; num_buckets even >= 4,
             half of them for each direction, exact below num_buckets // 4, logarithmic up to
             relative_max_distance). MPNet: 32 buckets, relative_max_distance 128.
    alibi_slopes: (heads,) fp32 (trainable too): score(i, j) -= alibi_slopes[h] * |i - j|.
             Either or both (summed). Added to the scaled scores: softmax(scale * q.k + bias). The kernels read a
             per-distance lookup (heads, 2L - 1) built per call, never a (seq, seq) tensor.
    c2p, p2c: DeBERTa-v2/v3's disentangled terms, either may be None: (total_tokens, heads, 2 * rel_span) packed or
             (batch, seq, heads, 2 * rel_span) padded, q's dtype, pre-scaled by the caller; differentiable (their
             gradients flow back to whatever made them):
               score(i, j) += c2p[i, h, slot(i, j)] + p2c[j, h, slot(i, j)]
             slot(i, j) = clamp(delta + rel_span, 0, 2 * rel_span - 1), delta = pos_i - pos_j, log-bucketed as
             transformers' make_log_bucket_position(delta, position_buckets, max_relative_positions) when
             position_buckets > 0 (fastenc/reference/attention_relative.py). DeBERTa: scale = 1 / sqrt(head_dim *
             (1 + number of position terms)), c2p = (q . pos_key) * scale, p2c = (k . pos_query) * scale.
             rel_span: int >= 1 (DeBERTa's position_buckets if > 0, else max_relative_positions);
             position_buckets: int (<= 0: no log buckets); max_relative_positions: int, needed with buckets.
    positions: per-token positions used by every relative term (relative_bias, alibi_slopes, c2p, p2c) instead of
             the index within the sequence: the distance of query i and key j is positions[i] - positions[j].
             Packed: (total_tokens,) int32/int64; padded: (batch, seq). Values >= 0; the lookups are built for
             L = max(longest sequence, positions.max() + 1). Given with no relative term: ValueError.
             Padded layout without positions: the padded index is each token's position. A mask with holes (a row
             not one contiguous run of real tokens) is served with a relative term (the padded index is then
             passed as positions, as transformers' MPNet and DeBERTa build them) but refused with a window.
    Extra memory of the relative terms: the caller's c2p / p2c (tokens x heads x slots each), O(heads x L) for the
    lookups, positions (tokens,) int32; never a (seq, seq) tensor outside the reference.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float(name, OP, t)
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"{OP}: q, k, v must have the same shape, got q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"{OP}: q, k, v must have the same dtype, got q {_dt(q.dtype)}, k {_dt(k.dtype)}, "
                         f"v {_dt(v.dtype)}")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"{OP}: q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    wl, wr = _window(window)
    p = _dropout_p(dropout_p)
    _check_generator(generator)
    d = q.shape[-1]
    if scale is None:
        scale = 1.0 / math.sqrt(d) if d else 1.0
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"{OP}: scale must be a finite float, got {scale!r}")
    if key_padding_mask is not None and cu_seqlens is not None:
        raise ValueError(f"{OP}: give key_padding_mask (padded layout) or cu_seqlens (packed layout), not both")
    biased = check_distance_bias(q, relative_bias, relative_max_distance, alibi_slopes)
    lead = tuple(q.shape[:-2])
    dis = check_disentangled(q, c2p, p2c, rel_span, position_buckets, max_relative_positions, lead)
    if positions is not None:
        if not biased and dis is None:
            raise ValueError(f"{OP}: positions are given but no relative term (relative_bias, alibi_slopes, c2p, "
                             "p2c) uses them")
        positions = check_positions(positions, lead, q.device)
    terms = _Relative(relative_bias, relative_max_distance, alibi_slopes, c2p, p2c, dis, biased)

    if cu_seqlens is not None:
        if q.dim() != 3:
            raise ValueError(f"{OP}: with cu_seqlens, q must be packed (total_tokens, heads, head_dim), "
                             f"got shape {tuple(q.shape)}")
        cu = check_cu_seqlens(cu_seqlens, q.shape[0], q.device, max_seqlen=_max_seqlen(max_seqlen))
        longest = max(b - a for a, b in zip(cu, cu[1:]))
        # The kernels get the longest length read now (it sizes their grids), not the caller's bound.
        return _run(q, k, v, cu_seqlens, longest, wl, wr, float(scale), backend, p, generator,
                    terms.build(longest, positions))

    if q.dim() != 4:
        raise ValueError(f"{OP}: q must be (batch, seq, heads, head_dim), or packed (total_tokens, heads, head_dim) "
                         f"with cu_seqlens; got shape {tuple(q.shape)}")
    if max_seqlen is not None:
        raise ValueError(f"{OP}: max_seqlen goes with cu_seqlens (packed layout)")
    b, s, h, _ = q.shape
    if q.numel() == 0:
        return q.new_zeros(q.shape)
    if key_padding_mask is None:
        cu = torch.arange(0, (b + 1) * s, s, dtype=torch.int32, device=q.device)
        out = _run(q.reshape(b * s, h, d), k.reshape(b * s, h, d), v.reshape(b * s, h, d), cu, s, wl, wr,
                   float(scale), backend, p, generator, terms.build(s, positions, rows=b * s))
        return out.view(q.shape)
    if not isinstance(key_padding_mask, torch.Tensor) or key_padding_mask.dtype != torch.bool:
        raise TypeError(f"{OP}: key_padding_mask must be a bool tensor, got "
                        f"{getattr(key_padding_mask, 'dtype', type(key_padding_mask).__name__)}")
    if tuple(key_padding_mask.shape) != (b, s):
        raise ValueError(f"{OP}: key_padding_mask must have shape (batch, seq)={(b, s)}, got {tuple(key_padding_mask.shape)}")
    if key_padding_mask.device != q.device:
        raise ValueError(f"{OP}: key_padding_mask must be on {q.device}, got {key_padding_mask.device}")
    if (wl >= 0 or wr >= 0 or terms.any) and _holes(key_padding_mask):
        # Window and relative distances are padded positions; unpadding preserves them only for contiguous real
        # tokens, so with holes the relative terms get the padded index as positions; a window is refused.
        if wl >= 0 or wr >= 0:
            raise ValueError(f"{OP}: with a window, each row of key_padding_mask must mark one contiguous run of "
                             "real tokens")
        if positions is None:
            positions = torch.arange(s, dtype=torch.int32, device=q.device).expand(b, s)
    idx, cu, longest = unpad_input(key_padding_mask)
    qp, kp, vp = (t.reshape(b * s, h, d).index_select(0, idx) for t in (q, k, v))
    out = _run(qp.contiguous(), kp.contiguous(), vp.contiguous(), cu, max(longest, 1), wl, wr, float(scale), backend,
               p, generator, terms.build(max(longest, 1), positions, rows=b * s, idx=idx))
    return pad_input(out, idx, b, s)


class _Relative:
    """The caller's relative terms, turned per call into what the kernels read (see build)."""

    def __init__(self, relative_bias, relative_max_distance, alibi_slopes, c2p, p2c, dis, biased):
        self.table, self.max_distance, self.slopes = relative_bias, relative_max_distance, alibi_slopes
        self.c2p, self.p2c, self.dis, self.biased = c2p, p2c, dis, biased
        self.any = biased or dis is not None

    def build(self, longest: int, positions=None, rows: int | None = None, idx=None):
        """-> (bias, positions, c2p, p2c, slot) for the packed tokens (None when no relative term): positions
        (int32, packed) and c2p / p2c (packed, contiguous) flattened to `rows` tokens and gathered at `idx` when
        given; the lookups cover L = max(longest, positions.max() + 1)."""
        if not self.any:
            return None
        n = longest
        if positions is not None:
            n = max(n, positions_reach(positions))
            positions = positions.reshape(-1) if rows is not None else positions
            if idx is not None:
                positions = positions.index_select(0, idx)
            positions = positions.to(torch.int32).contiguous()
        bias = distance_bias(n, self.table, self.max_distance, self.slopes) if self.biased else None
        c2p, p2c, slot = self.c2p, self.p2c, None
        if self.dis is not None:
            slot = slot_lookup(n, *self.dis, device=(c2p if c2p is not None else p2c).device)
            flat = []
            for t in (c2p, p2c):
                if t is not None:
                    t = t.reshape(rows, *t.shape[-2:]) if rows is not None else t
                    t = (t.index_select(0, idx) if idx is not None else t).contiguous()
                flat.append(t)
            c2p, p2c = flat
        return bias, positions, c2p, p2c, slot


def _run(q, k, v, cu_seqlens, max_seqlen, wl, wr, scale, backend, dropout_p=0.0, generator=None, rel=None):
    """max_seqlen: the longest sequence. dropout_p > 0: (seed, offset) are drawn here, once the backends are
    chosen. rel: (bias, positions, c2p, p2c, slot) as _Relative.build gives them, or None."""
    if q.numel() == 0:
        return q.new_zeros(q.shape)
    impl, wl, wr = select(q, k, v, cu_seqlens, max_seqlen, wl, wr, scale, backend, dropout_p, rel)
    if rel is not None:
        seed, offset = draw_seed_offset(generator) if dropout_p > 0 else (0, 0)
        return _attention_op(q, k, v, cu_seqlens, max_seqlen, wl, wr, scale, impl.backend, dropout_p, seed, offset,
                             *rel)[0]
    if dropout_p > 0:
        seed, offset = draw_seed_offset(generator)
        return _attention_op(q, k, v, cu_seqlens, max_seqlen, wl, wr, scale, impl.backend, dropout_p, seed,
                             offset)[0]
    return _attention_op(q, k, v, cu_seqlens, max_seqlen, wl, wr, scale, impl.backend)[0]


def select(q, k, v, cu_seqlens, max_seqlen, wl, wr, scale, backend, dropout_p, rel=None):
    """(forward Impl, wl, wr): the backend for these inputs (q, k, v of any strides: each backend gets what it
    accepts); when they need a gradient the backward's is chosen too, so an unservable backward fails before the
    forward runs. A window side >= the longest sequence becomes -1 (so no kernel ever computes i + 2**63 - 1).
    rel: (bias, positions, c2p, p2c, slot) or None."""
    # Under torch.compile the longest length is symbolic: the bound is the token count there (a side between the
    # two bounds nothing either way; the kernels then walk the band instead of the whole sequence).
    bound = q.shape[0] if torch.compiler.is_compiling() else max_seqlen
    wl = -1 if wl >= bound else wl
    wr = -1 if wr >= bound else wr
    bias, positions, c2p, p2c, slot = rel if rel is not None else (None,) * 5
    inputs = {"q": q, "k": k, "v": v, "cu_seqlens": cu_seqlens, "max_seqlen": max_seqlen,
              "window": (wl, wr), "scale": scale, "dropout_p": dropout_p, "bias": bias, "positions": positions,
              "c2p": c2p, "p2c": p2c, "slot": slot}
    impl = registry.select(OP, inputs, backend)
    if needs_grad(q, k, v, bias, c2p, p2c):
        registry.select_backward(OP_BWD, _bwd_inputs(q, q, k, v, cu_seqlens, max_seqlen, wl, wr, scale, dropout_p,
                                                     rel), impl.backend)
    return impl, wl, wr
