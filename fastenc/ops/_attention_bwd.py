"""fastenc::attention_bwd: the backward of fastenc::attention (FlashAttention-2's, Dao 2023), one Impl per backend,
and the autograd formula fastenc/ops/attention.py attaches to its forward op.

Contract of every backend (packed variable-length layout, as the forward):
  fn(grad, q, k, v, out, lse, cu_seqlens, max_seqlen, window_left, window_right, scale) -> (dq, dk, dv)
  grad, q, k, v, out: (total_tokens, heads, head_dim), one dtype (q, k, v may be row-strided views, as the
  forward's: the cpu kernel reads fp32 ones in place, Triton gets contiguous copies through contiguous_args); lse: (heads, total_tokens) fp32 as the
  forward saved it; dq, dk, dv in q's dtype. The probabilities are recomputed from lse, never stored.
With dropout, or when only some gradients are needed, a backend gets five more arguments,
  fn(..., scale, dropout_p, seed, offset, need_dq, need_dkdv)
(the forward's dropout_p, seed, offset: the keep-mask is regenerated, never stored); a gradient not needed comes
back as an empty tensor and its work is skipped where the kernels allow (dq: the Triton dQ kernel, the CPU
kernel's dQ product; dk and dv: the Triton dK/dV kernel, the CPU kernel's dK and dV products).
With a distance bias (the forward's (heads, 2L - 1) lookup, fastenc/ops/attention.py) the backward is the op
fastenc::attention_bwd_bias, whose backends are called
  fn(..., scale, dropout_p, seed, offset, need_dq, need_dkdv, bias=bias) -> (dq, dk, dv, dbias)
dbias: (heads, 2L - 1) fp32, the sum of dS over the (i, j) pairs at each distance i - j, per head.
With any relative term (the distance bias, per-token positions, DeBERTa's c2p / p2c with their slot lookup:
fastenc/ops/attention.py) the backends of fastenc::attention_bwd_bias get all of them, positionally, None when absent,
  fn(..., need_dq, need_dkdv, bias, positions, c2p, p2c, slot) -> (dq, dk, dv, dbias, dc2p, dp2c)
with an empty tensor (numel 0) for each gradient whose input is None; dc2p[i, h, s] = the sum of dS_ij over the
keys j with slot(i, j) = s, dp2c[j, h, s] = over the queries i; both fp32 (the op casts them to c2p's dtype).
"""
from __future__ import annotations

import torch

from fastenc import registry
from fastenc.ops import _backends
from fastenc.ops._library import custom_op
from fastenc.reference.attention_bwd import attention_bwd_varlen_ref
from fastenc.registry import _dt

OP_BWD = "attention_bwd"


def _reference(grad, q, k, v, out, lse, cu_seqlens, max_seqlen, window_left, window_right, scale, dropout_p=0.0,
               seed=0, offset=0, need_dq=True, need_dkdv=True, bias=None, positions=None, c2p=None, p2c=None,
               slot=None):
    rel = (bias, positions, c2p, p2c, slot)
    dq, dk, dv, *extra = attention_bwd_varlen_ref(grad, q, k, v, out, lse, cu_seqlens, (window_left, window_right),
                                                  scale, dropout_p=dropout_p, seed=seed, offset=offset, bias=bias,
                                                  positions=positions, c2p=c2p, p2c=p2c, slot=slot)
    grads = (dq if need_dq else q.new_empty(0), dk if need_dkdv else q.new_empty(0),
             dv if need_dkdv else q.new_empty(0))
    if all(t is None for t in rel):
        return grads
    extra = (extra + [None, None, None])[:3]
    return grads + tuple(q.new_empty(0, dtype=torch.float32) if t is None else t.float() for t in extra)


def check_bwd_args(grad, q, k, v, out, lse) -> None:
    """Shapes and dtypes every backend relies on; raises ValueError naming the argument."""
    for name, t in (("grad", grad), ("k", k), ("v", v), ("out", out)):
        if tuple(t.shape) != tuple(q.shape):
            raise ValueError(f"{OP_BWD}: {name} must have q's shape {tuple(q.shape)}, got {tuple(t.shape)}")
        if t.dtype != q.dtype:
            raise ValueError(f"{OP_BWD}: {name} must have q's dtype {_dt(q.dtype)}, got {_dt(t.dtype)}")
        if t.device != q.device:
            raise ValueError(f"{OP_BWD}: {name} must be on q's device {q.device}, got {t.device}")
    want = (q.shape[1], q.shape[0])
    if tuple(lse.shape) != want or lse.dtype != torch.float32:
        raise ValueError(f"{OP_BWD}: lse must be float32 of shape (heads, total_tokens)={want}, got "
                         f"{_dt(lse.dtype)} {tuple(lse.shape)}")


@custom_op("fastenc::attention_bwd", mutates_args=())
def _attention_bwd_op(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                      lse: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, window_left: int,
                      window_right: int, scale: float, backend: str, dropout_p: float = 0.0, seed: int = 0,
                      offset: int = 0, need_dq: bool = True,
                      need_dkdv: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    check_bwd_args(grad, q, k, v, out, lse)
    if not 0 <= dropout_p < 1:
        raise ValueError(f"{OP_BWD}: dropout_p must be in [0, 1), got {dropout_p!r}")
    fn = registry.impl(OP_BWD, backend).fn
    args = (grad, q, k, v, out, lse, cu_seqlens, max_seqlen, window_left, window_right, scale)
    if dropout_p > 0 or not (need_dq and need_dkdv):
        return fn(*args, dropout_p, seed, offset, need_dq, need_dkdv)
    return fn(*args)


@_attention_bwd_op.register_fake
def _(grad, q, k, v, out, lse, cu_seqlens, max_seqlen, window_left, window_right, scale, backend, dropout_p=0.0,
      seed=0, offset=0, need_dq=True, need_dkdv=True):
    return (torch.empty_like(q) if need_dq else q.new_empty(0), torch.empty_like(k) if need_dkdv else q.new_empty(0),
            torch.empty_like(v) if need_dkdv else q.new_empty(0))


def check_relative_args(q, bias, positions, c2p, p2c, slot, op: str = OP_BWD) -> None:
    """The relative terms' shapes and dtypes every backend relies on; raises ValueError naming the argument."""
    heads, total = q.shape[1], q.shape[0]
    if bias is not None and (bias.dim() != 2 or bias.shape[0] != heads or bias.shape[1] % 2 == 0
                             or bias.dtype != torch.float32):
        raise ValueError(f"{op}: bias must be float32 (heads={heads}, 2L - 1), got {_dt(bias.dtype)} "
                         f"{tuple(bias.shape)}")
    if positions is not None and (positions.dtype != torch.int32 or tuple(positions.shape) != (total,)):
        raise ValueError(f"{op}: positions must be int32 (total_tokens={total},), got {_dt(positions.dtype)} "
                         f"{tuple(positions.shape)}")
    if (c2p is not None or p2c is not None) != (slot is not None):
        raise ValueError(f"{op}: slot must be given exactly when c2p or p2c is")
    if slot is not None:
        if slot.dtype != torch.int32 or slot.dim() != 1 or slot.shape[0] % 2 == 0:
            raise ValueError(f"{op}: slot must be int32 (2L - 1,), got {_dt(slot.dtype)} {tuple(slot.shape)}")
        if bias is not None and bias.shape[1] != slot.shape[0]:
            raise ValueError(f"{op}: bias and slot must cover one L, got {bias.shape[1]} and {slot.shape[0]} entries")
    for name, t in (("c2p", c2p), ("p2c", p2c)):
        if t is not None and (t.dim() != 3 or t.shape[:2] != q.shape[:2] or t.dtype != q.dtype):
            raise ValueError(f"{op}: {name} must be {_dt(q.dtype)} (total_tokens, heads, slots)="
                             f"({total}, {heads}, slots), got {_dt(t.dtype)} {tuple(t.shape)}")


@custom_op("fastenc::attention_bwd_bias", mutates_args=())
def _attention_bwd_bias_op(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                           lse: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, window_left: int,
                           window_right: int, scale: float, backend: str, dropout_p: float, seed: int, offset: int,
                           need_dq: bool, need_dkdv: bool, bias: torch.Tensor | None,
                           positions: torch.Tensor | None = None, c2p: torch.Tensor | None = None,
                           p2c: torch.Tensor | None = None, slot: torch.Tensor | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                      torch.Tensor]:
    """The backward with relative terms: (dq, dk, dv, dbias, dc2p, dp2c); dbias (heads, 2L - 1) fp32 like bias,
    dc2p / dp2c in c2p's / p2c's dtype; empty (numel 0) where the input is None."""
    check_bwd_args(grad, q, k, v, out, lse)
    check_relative_args(q, bias, positions, c2p, p2c, slot)
    if not 0 <= dropout_p < 1:
        raise ValueError(f"{OP_BWD}: dropout_p must be in [0, 1), got {dropout_p!r}")
    fn = registry.impl(OP_BWD, backend).fn
    dq, dk, dv, dbias, dc2p, dp2c = fn(grad, q, k, v, out, lse, cu_seqlens, max_seqlen, window_left, window_right,
                                       scale, dropout_p, seed, offset, need_dq, need_dkdv, bias, positions, c2p, p2c,
                                       slot)
    return (dq, dk, dv, dbias, dc2p if c2p is None else dc2p.to(c2p.dtype),
            dp2c if p2c is None else dp2c.to(p2c.dtype))


@_attention_bwd_bias_op.register_fake
def _(grad, q, k, v, out, lse, cu_seqlens, max_seqlen, window_left, window_right, scale, backend, dropout_p, seed,
      offset, need_dq, need_dkdv, bias, positions=None, c2p=None, p2c=None, slot=None):
    def like(t, dtype=None):
        return q.new_empty(0, dtype=dtype or torch.float32) if t is None else torch.empty_like(t)
    return (torch.empty_like(q) if need_dq else q.new_empty(0), torch.empty_like(k) if need_dkdv else q.new_empty(0),
            torch.empty_like(v) if need_dkdv else q.new_empty(0), like(bias), like(c2p), like(p2c))


def no_bias(inputs) -> list[str]:
    """The reason a backend without the distance bias (relative_bias / alibi_slopes) gives when one is given: a
    backend that does not serve the bias adds this to its check, so the dispatcher never drops the bias."""
    if inputs.get("bias") is not None:
        return ["a distance bias (relative_bias / alibi_slopes) is not supported"]
    return []


def no_relative(inputs) -> list[str]:
    """The reasons a backend without per-token positions / DeBERTa's disentangled terms gives when they are given
    (added to its check, so the dispatcher passes it over saying why, never dropping a term)."""
    why = []
    if inputs.get("positions") is not None:
        why.append("no positions")
    if inputs.get("c2p") is not None or inputs.get("p2c") is not None:
        why.append("no disentangled terms")
    return why


def legacy_bias_fwd(fn):
    """wrap= of a forward kernel that takes the distance bias but not yet positions, c2p, p2c, slot (its check
    declines those through no_relative, so they arrive as None): calls fn(..., offset, bias)."""
    def call(*args, **kwargs):
        if len(args) > 12:
            if any(a is not None for a in args[12:]):
                raise ValueError("attention: this backend serves no positions nor disentangled terms")
            args = args[:12]
        return fn(*args, **kwargs)
    call.__name__ = getattr(fn, "__name__", "attention_fwd")
    return call


def legacy_bias_bwd(fn):
    """wrap= of a backward kernel that takes the distance bias (as bias=) but not yet positions, c2p, p2c, slot
    (declined by no_relative): calls fn(..., need_dkdv, bias=bias) and returns (dq, dk, dv, dbias, empty, empty)."""
    def call(*args, **kwargs):
        if len(args) <= 16:
            return fn(*args, **kwargs)
        if any(a is not None for a in args[17:]):
            raise ValueError("attention_bwd: this backend serves no positions nor disentangled terms")
        res = fn(*args[:16], bias=args[16], **kwargs)
        q = args[1]
        none = q.new_empty(0, dtype=torch.float32)
        if len(res) == 3:
            return (*res, none, none, none)
        return (*res, q.new_empty(0, dtype=torch.float32), q.new_empty(0, dtype=torch.float32))
    call.__name__ = getattr(fn, "__name__", "attention_bwd")
    return call


def _head_dim(inputs) -> int:
    return int(inputs["q"].shape[-1])


def _triton_check(inputs) -> list[str]:
    d = _head_dim(inputs)
    if d % 8 or not 8 <= d <= 256:
        return [f"head_dim must be a multiple of 8 in [8, 256], got {d}"]
    return []


def _cpu_check(inputs) -> list[str]:
    d = _head_dim(inputs)
    if not 1 <= d <= 256:
        return [f"head_dim must be in [1, 256], got {d}"]
    return []


def contiguous_args(n: int):
    """wrap= of a backend whose kernel assumes contiguous tensors: its first n arguments are made contiguous (a copy
    only where one is not)."""
    def wrap(fn):
        def call(*args, **kwargs):
            return fn(*(a.contiguous() for a in args[:n]), *args[n:], **kwargs)
        call.__name__ = getattr(fn, "__name__", "contiguous")
        return call
    return wrap


def _cuda_check(inputs) -> list[str]:
    why = registry.triton_available()
    return ([f"the Triton kernel that serves it is unavailable: {why}"] if why else []) + _triton_check(inputs)


_backends.implement(OP_BWD, "reference", _reference)
_backends.implement(OP_BWD, "triton", "fastenc.kernels.attention_bwd", "attention_bwd",
                    check=lambda inputs: _triton_check(inputs) + no_relative(inputs),
                    wrap=lambda fn: contiguous_args(5)(legacy_bias_bwd(fn)), limits="head_dim multiple of 8 <= 256; contiguous inputs (copied if not); "
                                                 "CUDA, CPU tensors under TRITON_INTERPRET=1")
# The cpu kernel reads fp32 q, k, v row-strided in place and, given grad_qkv, writes dq, dk, dv into its column
# blocks (fastenc/ops/attention_qkv.py asks WRITES_GRAD_QKV).
CPU_BWD = _backends.implement(OP_BWD, "cpu", "attention_bwd", check=_cpu_check,
                              limits="head_dim <= 256, fp32 math, tiled (no seq x seq); strided q, k, v and gradients; "
                                     "distance bias, positions, c2p/p2c")
WRITES_GRAD_QKV = (CPU_BWD,)
_backends.implement(OP_BWD, "cuda", "attention_bwd", dtypes=(torch.float16, torch.bfloat16),
                    check=lambda inputs: _cuda_check(inputs) + no_relative(inputs),
                    wrap=lambda _ext: contiguous_args(5)(legacy_bias_bwd(
                        _backends.lazy("fastenc.kernels.attention_bwd", "attention_bwd"))),
                    limits="served by the Triton kernel (fastenc/kernels/attention_bwd.py); fp16/bf16, head_dim "
                      "multiple of 8 <= 256")


def _bwd_inputs(grad, q, k, v, cu_seqlens, max_seqlen, wl, wr, scale, dropout_p=0.0, rel=None) -> dict:
    """rel: (bias, positions, c2p, p2c, slot) or None."""
    bias, positions, c2p, p2c, slot = rel if rel is not None else (None,) * 5
    return {"grad": grad, "q": q, "k": k, "v": v, "cu_seqlens": cu_seqlens, "max_seqlen": max_seqlen,
            "window": (wl, wr), "scale": scale, "dropout_p": dropout_p, "bias": bias, "positions": positions,
            "c2p": c2p, "p2c": p2c, "slot": slot}


def setup_context(ctx, inputs, output):
    """Saves q, k, v, out, lse, cu_seqlens (and the relative terms: the distance bias lookup, positions, c2p, p2c,
    the slot lookup); with dropout only (seed, offset) besides (never the mask)."""
    q, k, v, cu_seqlens, max_seqlen, wl, wr, scale, backend, *rest = inputs
    out, lse = output
    drop, rel = rest[:3], tuple(rest[3:8]) + (None,) * (5 - len(rest[3:8]))
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens, *rel)
    ctx.mark_non_differentiable(lse)
    ctx.args = (max_seqlen, wl, wr, scale, backend)
    ctx.dropout = tuple(drop) + (0.0, 0, 0)[len(drop):]  # (dropout_p, seed, offset)


# Positions of the relative terms among fastenc::attention's inputs: bias, positions, c2p, p2c, slot.
_BIAS, _C2P, _P2C = 12, 14, 15


def backward(ctx, grad, _grad_lse):
    """grad: d loss / d out (any strides, zero strides included); lse is not differentiable (its gradient is
    ignored). Inputs that need no gradient get None; nothing is computed when none does."""
    n_in = len(ctx.needs_input_grad)
    need = ctx.needs_input_grad[:3]
    nones = (None,) * (n_in - 3)
    need_rel = [n_in > i and ctx.needs_input_grad[i] for i in (_BIAS, _C2P, _P2C)]
    if not any(need) and not any(need_rel):
        return (None, None, None) + nones
    q, k, v, out, lse, cu_seqlens, *rel = ctx.saved_tensors
    max_seqlen, wl, wr, scale, backend = ctx.args
    if tuple(grad.shape) != tuple(out.shape) or grad.dtype != out.dtype:
        raise ValueError(f"attention backward: grad must be {_dt(out.dtype)} of shape {tuple(out.shape)}, got "
                         f"{_dt(grad.dtype)} {tuple(grad.shape)}")
    grad = grad.contiguous()
    dropout_p, seed, offset = ctx.dropout
    impl = registry.select_backward(OP_BWD, _bwd_inputs(grad, q, k, v, cu_seqlens, max_seqlen, wl, wr, scale,
                                                        dropout_p, rel), backend)
    if any(t is not None for t in rel):
        dq, dk, dv, *drel = _attention_bwd_bias_op(grad, q, k, v, out, lse, cu_seqlens, max_seqlen, wl, wr, scale,
                                                   impl.backend, dropout_p, seed, offset, need[0],
                                                   need[1] or need[2], *rel)
        grads = list((dq if need[0] else None, dk if need[1] else None, dv if need[2] else None) + nones)
        for i, want, g in zip((_BIAS, _C2P, _P2C), need_rel, drel):
            if want:
                grads[i] = g
        return tuple(grads)
    if dropout_p > 0 or not all(need):
        dq, dk, dv = _attention_bwd_op(grad, q, k, v, out, lse, cu_seqlens, max_seqlen, wl, wr, scale, impl.backend,
                                       dropout_p, seed, offset, need[0], need[1] or need[2])
    else:
        dq, dk, dv = _attention_bwd_op(grad, q, k, v, out, lse, cu_seqlens, max_seqlen, wl, wr, scale, impl.backend)
    return (dq if need[0] else None, dk if need[1] else None, dv if need[2] else None) + nones
