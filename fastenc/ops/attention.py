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
    _bwd_inputs, _cpu_check, _head_dim, _triton_check, backward, contiguous_args, setup_context)
from fastenc.ops._library import custom_op
from fastenc.padding import pad_input, unpad_input
from fastenc.reference.attention import attention_varlen_ref
from fastenc.reference.attention_bias import distance_bias
from fastenc.reference.attention_bwd import attention_lse_varlen_ref

OP = "attention"
OP_BWD = "attention_bwd"


def _reference(q, k, v, cu_seqlens, max_seqlen, window_left, window_right, scale, dropout_p=0.0, seed=0, offset=0,
               bias=None):
    window = (window_left, window_right)
    out = attention_varlen_ref(q, k, v, cu_seqlens, window, scale, dropout_p=dropout_p, seed=seed, offset=offset,
                               bias=bias)
    return out, attention_lse_varlen_ref(q, k, cu_seqlens, window, scale, bias).float()


@custom_op("fastenc::attention", mutates_args=())
def _attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                  window_left: int, window_right: int, scale: float, backend: str, dropout_p: float = 0.0,
                  seed: int = 0, offset: int = 0,
                  bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    fn = registry.impl(OP, backend).fn
    if bias is not None:
        return fn(q, k, v, cu_seqlens, max_seqlen, window_left, window_right, scale, dropout_p, seed, offset, bias)
    if dropout_p > 0:
        return fn(q, k, v, cu_seqlens, max_seqlen, window_left, window_right, scale, dropout_p, seed, offset)
    return fn(q, k, v, cu_seqlens, max_seqlen, window_left, window_right, scale)


@_attention_op.register_fake
def _(q, k, v, cu_seqlens, max_seqlen, window_left, window_right, scale, backend, dropout_p=0.0, seed=0, offset=0,
      bias=None):
    return torch.empty_like(q), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


_backends.implement(OP, "reference", _reference)
_attention_op.register_autograd(backward, setup_context)  # fastenc/ops/_attention_bwd.py


_backends.implement(OP, "triton", "fastenc.kernels.attention", "attention_fwd", check=_triton_check,
                    wrap=contiguous_args(3),
                    limits="head_dim multiple of 8 <= 256; distance bias; contiguous q, k, v (copied if not); CUDA, CPU tensors "
                        "under TRITON_INTERPRET=1")
_backends.implement(OP, "cpu", "attention", check=_cpu_check,
                    limits="head_dim <= 256, fp32 math; distance bias; fp32 q, k, v read in place with one row stride")


def _cuda_check(inputs) -> list[str]:
    d = _head_dim(inputs)
    why = [] if d in (32, 64, 96, 128) else [f"head_dim must be 32, 64, 96 or 128, got {d}"]
    return why + (["dropout_p > 0 not supported"] if inputs.get("dropout_p", 0.0) > 0 else [])


_backends.implement(OP, "cuda", "attention_cuda", dtypes=(torch.float16, torch.bfloat16), check=_cuda_check,
                    wrap=contiguous_args(3), limits="fp16/bf16, head_dim 32/64/96/128; distance bias; contiguous q, k, v (copied if not); "
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
              alibi_slopes: torch.Tensor | None = None, backend: str | None = None) -> torch.Tensor:
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
             Either or both (summed). Positions are those within each sequence (packed) or padded positions
             (padded; with key_padding_mask each row must mark one contiguous run of real tokens, as a window).
             Added to the scaled scores: softmax(scale * q.k + bias). The kernels read a per-distance lookup
             (heads, 2 * max_seqlen - 1) built per call, never a (seq, seq) tensor.
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

    def lut(n):
        return distance_bias(n, relative_bias, relative_max_distance, alibi_slopes) if biased else None

    if cu_seqlens is not None:
        if q.dim() != 3:
            raise ValueError(f"{OP}: with cu_seqlens, q must be packed (total_tokens, heads, head_dim), "
                             f"got shape {tuple(q.shape)}")
        cu = check_cu_seqlens(cu_seqlens, q.shape[0], q.device, max_seqlen=_max_seqlen(max_seqlen))
        longest = max(b - a for a, b in zip(cu, cu[1:]))
        # The kernels get the longest length read now (it sizes their grids), not the caller's bound.
        return _run(q, k, v, cu_seqlens, longest, wl, wr, float(scale), backend, p, generator, lut(longest))

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
                   float(scale), backend, p, generator, lut(s))
        return out.view(q.shape)
    if not isinstance(key_padding_mask, torch.Tensor) or key_padding_mask.dtype != torch.bool:
        raise TypeError(f"{OP}: key_padding_mask must be a bool tensor, got "
                        f"{getattr(key_padding_mask, 'dtype', type(key_padding_mask).__name__)}")
    if tuple(key_padding_mask.shape) != (b, s):
        raise ValueError(f"{OP}: key_padding_mask must have shape (batch, seq)={(b, s)}, got {tuple(key_padding_mask.shape)}")
    if key_padding_mask.device != q.device:
        raise ValueError(f"{OP}: key_padding_mask must be on {q.device}, got {key_padding_mask.device}")
    if wl >= 0 or wr >= 0 or biased:
        # Window and bias distances are padded positions; unpadding preserves them only for contiguous real tokens.
        m = key_padding_mask.to(torch.int8)
        starts = (m[:, 1:] > m[:, :-1]).sum(1) + m[:, 0]
        if bool((starts > 1).any()):
            raise ValueError(f"{OP}: with a window or a distance bias (relative_bias, alibi_slopes), each row of "
                             "key_padding_mask must mark one contiguous run of real tokens")
    idx, cu, longest = unpad_input(key_padding_mask)
    qp, kp, vp = (t.reshape(b * s, h, d).index_select(0, idx) for t in (q, k, v))
    out = _run(qp.contiguous(), kp.contiguous(), vp.contiguous(), cu, max(longest, 1), wl, wr, float(scale), backend,
               p, generator, lut(max(longest, 1)))
    return pad_input(out, idx, b, s)


def _run(q, k, v, cu_seqlens, max_seqlen, wl, wr, scale, backend, dropout_p=0.0, generator=None, bias=None):
    """max_seqlen: the longest sequence. dropout_p > 0: (seed, offset) are drawn here, once the backends are
    chosen. bias: the (heads, 2 * max_seqlen - 1) distance lookup or None."""
    if q.numel() == 0:
        return q.new_zeros(q.shape)
    impl, wl, wr = select(q, k, v, cu_seqlens, max_seqlen, wl, wr, scale, backend, dropout_p, bias)
    if bias is not None:
        seed, offset = draw_seed_offset(generator) if dropout_p > 0 else (0, 0)
        return _attention_op(q, k, v, cu_seqlens, max_seqlen, wl, wr, scale, impl.backend, dropout_p, seed, offset,
                             bias)[0]
    if dropout_p > 0:
        seed, offset = draw_seed_offset(generator)
        return _attention_op(q, k, v, cu_seqlens, max_seqlen, wl, wr, scale, impl.backend, dropout_p, seed,
                             offset)[0]
    return _attention_op(q, k, v, cu_seqlens, max_seqlen, wl, wr, scale, impl.backend)[0]


def select(q, k, v, cu_seqlens, max_seqlen, wl, wr, scale, backend, dropout_p, bias=None):
    """(forward Impl, wl, wr): the backend for these inputs (q, k, v of any strides: each backend gets what it
    accepts); when they need a gradient the backward's is chosen too, so an unservable backward fails before the
    forward runs. A window side >= the longest sequence becomes -1 (so no kernel ever computes i + 2**63 - 1)."""
    # Under torch.compile the longest length is symbolic: the bound is the token count there (a side between the
    # two bounds nothing either way; the kernels then walk the band instead of the whole sequence).
    bound = q.shape[0] if torch.compiler.is_compiling() else max_seqlen
    wl = -1 if wl >= bound else wl
    wr = -1 if wr >= bound else wr
    inputs = {"q": q, "k": k, "v": v, "cu_seqlens": cu_seqlens, "max_seqlen": max_seqlen,
              "window": (wl, wr), "scale": scale, "dropout_p": dropout_p, "bias": bias}
    impl = registry.select(OP, inputs, backend)
    if needs_grad(q, k, v) or (bias is not None and bias.requires_grad):
        registry.select_backward(OP_BWD, _bwd_inputs(q, q, k, v, cu_seqlens, max_seqlen, wl, wr, scale, dropout_p,
                                                     bias), impl.backend)
    return impl, wl, wr
