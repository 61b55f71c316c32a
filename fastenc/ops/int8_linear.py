"""fastenc.ops.int8_linear: the int8 linear layer y = act(dequant(quant_rows(x) Wq^T) + bias (+ residual)) on a
weight quantized per output channel and packed once (fastenc.quant.pack_int8); the math and the packed layout are
fastenc.reference.int8_linear's.

Every backend implements one contract:
  fn(x, packed, n, bias, residual, gelu, asym) -> y
  x: (m, k) fp32 contiguous; packed: uint8 (packed_bytes(n, k),); bias: (n,) fp32 or None; residual: (m, n) fp32 or
  None; gelu: "" (none), "none" (exact GELU) or "tanh"; asym: per-row zero points (else symmetric rows).
  Returns a new (m, n) fp32 tensor; the inputs are never written.
reference: plain PyTorch (exact integer products in fp64), any device. cpu: csrc/cpu/int8_linear*.cpp on AVX2,
AVX-512 VNNI or AMX, whichever this machine runs fastest (FASTENC_INT8_ISA names one: fastenc.quant.isa); the
integer sums are the reference's bit for bit, the fp32 epilogue within rounding. Inference only: no backward.
"""
from __future__ import annotations

from typing import Optional

import torch

from fastenc import registry
from fastenc.ops import _backends
from fastenc.ops._common import check_like
from fastenc.ops._library import custom_op
from fastenc.reference.int8_linear import MAX_K, int8_linear_ref, npad, packed_bytes

OP = "int8_linear"
GELUS = (None, "none", "tanh")


def _reference(x, packed, n, bias, residual, gelu, asym):
    return int8_linear_ref(x, packed, n, bias, residual, gelu or None, asym)


def _cpu(fn):
    """The extension's int8_linear (x quantized and multiplied in one call), the residual added in its epilogue."""
    def call(x, packed, n, bias, residual, gelu, asym):
        from fastenc.quant.isa import isa

        out = residual.clone() if residual is not None else None
        return fn(x, packed, n, bias, out, residual is not None, gelu or None, asym, isa())
    return call


@custom_op("fastenc::int8_linear", mutates_args=())
def _int8_linear_op(x: torch.Tensor, packed: torch.Tensor, n: int, bias: Optional[torch.Tensor],
                    residual: Optional[torch.Tensor], gelu: str, asym: bool, backend: str) -> torch.Tensor:
    return registry.impl(OP, backend).fn(x, packed, n, bias, residual, gelu, asym)


@_int8_linear_op.register_fake
def _(x, packed, n, bias, residual, gelu, asym, backend):
    return x.new_empty((x.shape[0], n), dtype=torch.float32)


def _no_backward(ctx, grad):
    raise RuntimeError("fastenc::int8_linear has no backward: int8 models are for inference; train the fp32 model "
                       "(fastenc.dequantize) and quantize it again")


_int8_linear_op.register_autograd(_no_backward, lambda ctx, inputs, output: None)

_FP32 = (torch.float32,)
_backends.implement(OP, "reference", _reference, dtypes=_FP32, limits="fp32; exact integer products (fp64)")
_backends.implement(OP, "cpu", "int8_linear", wrap=_cpu, dtypes=_FP32,
                    limits="fp32 x; u8 x s8 products on AVX2, AVX-512 VNNI or AMX (run-time choice)")


def check_packed(op: str, packed, n, k: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{op}: n (the weight's out_features) must be an int >= 1, got {n!r}")
    if not 1 <= k <= MAX_K:
        raise ValueError(f"{op}: x must have 1 to {MAX_K} columns (in_features), got {k}")
    if not isinstance(packed, torch.Tensor):
        raise TypeError(f"{op}: packed must be a torch.Tensor (fastenc.quant.pack_int8's), got {type(packed).__name__}")
    want = packed_bytes(n, k)
    if packed.dtype != torch.uint8 or packed.dim() != 1 or packed.numel() != want or not packed.is_contiguous():
        raise ValueError(f"{op}: packed must be fastenc.quant.pack_int8's contiguous uint8 ({want},) for an ({n}, {k}) "
                         f"weight, got {str(packed.dtype).removeprefix('torch.')} {tuple(packed.shape)}")
    scales = packed[-npad(n) * 4:].view(torch.float32)  # real columns have scales > 0, the padding 0
    held = int((scales > 0).sum())
    if held != n:
        raise ValueError(f"{op}: packed holds a weight of {held} output features, n is {n}")


def int8_linear(x: torch.Tensor, packed: torch.Tensor, n: int, bias: torch.Tensor | None = None, *,
                residual: torch.Tensor | None = None, gelu: str | None = None, asym: bool = True,
                backend: str | None = None) -> torch.Tensor:
    """x (..., k) fp32 times the int8 weight packed by fastenc.quant.pack_int8 (n output features), x quantized
    per row (asym: with a zero point per row; else symmetric), + bias (n,) (+ residual (..., n)), then GELU when
    gelu is "none" (exact) or "tanh". Returns (..., n) fp32. Inference only (no backward)."""
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
        raise TypeError(f"{OP}: x must be a float32 tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    if x.dim() < 1:
        raise ValueError(f"{OP}: x must be (..., k), got a 0-d tensor")
    k = x.shape[-1]
    check_packed(OP, packed, n, k)
    if packed.device != x.device:
        raise ValueError(f"{OP}: packed must be on x's device {x.device}, got {packed.device}")
    lead = tuple(x.shape[:-1])
    check_like("bias", OP, bias, x, shape=(n,))
    check_like("residual", OP, residual, x, shape=lead + (n,))
    if gelu not in GELUS:
        raise ValueError(f"{OP}: gelu must be None, 'none' or 'tanh', got {gelu!r}")
    x2 = x.reshape(-1, k).contiguous()
    r2 = None if residual is None else residual.reshape(-1, n).contiguous()
    inputs = {"x": x2, "packed": packed, "n": n, "bias": bias, "residual": r2, "gelu": gelu or "", "asym": bool(asym)}
    impl = registry.select(OP, inputs, backend)
    return _int8_linear_op(x2, packed, n, bias, r2, gelu or "", bool(asym), impl.backend).view(*lead, n)
