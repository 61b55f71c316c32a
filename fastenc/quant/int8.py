"""The int8 form of one fastenc.layers.Linear: its fp32 weight quantized per output channel and packed for the int8
GEMM (csrc/cpu/int8_linear*.cpp), and the layer's inference calls on it (plain, into/added to an output, with the
MLP's GELU in the epilogue, cut into row blocks for the QKV planes). The fp32 weight stays the layer's parameter:
the int8 form is a cache beside it, rebuilt when the weight changes (an in-place write, a replaced parameter)."""
from __future__ import annotations

import contextlib
import weakref

import torch

from fastenc import extension, registry
from fastenc.layers.steps import optimizer_steps
from fastenc.quant.isa import isa
from fastenc.reference.int8_linear import pack_int8_ref, quantize_weight_ref


EVENT = "fastenc::int8_linear"  # the profiler name of the extension's int8 calls (followed by M x K x N)


def pack_int8(weight: torch.Tensor) -> torch.Tensor:
    """weight (n, k) float -> the packed int8 weight of fastenc.ops.int8_linear (per-output-channel symmetric
    scales, fastenc.reference.int8_linear's layout): uint8 (packed_bytes(n, k),) on weight's device."""
    if not isinstance(weight, torch.Tensor) or not weight.is_floating_point() or weight.dim() != 2:
        raise ValueError(f"pack_int8: weight must be a 2-D float tensor, got "
                         f"{getattr(weight, 'dtype', type(weight).__name__)} {tuple(getattr(weight, 'shape', ()))}")
    if weight.numel() and not bool(torch.isfinite(weight).all()):
        raise ValueError("pack_int8: weight holds NaN or infinity")
    wq, scale = quantize_weight_ref(weight)
    if weight.device.type == "cpu" and extension.cpu_available() is None:
        return extension.load().int8_pack(wq, scale)
    return pack_int8_ref(wq, scale)


def _direct(x: torch.Tensor) -> bool:
    """The extension's int8 calls serve x: CPU fp32 2-D, unit column stride, the cpu backend allowed."""
    return (x.dtype == torch.float32 and not x.is_cuda and x.dim() == 2 and x.stride(-1) == 1 and x.is_cpu
            and registry.backend_allowed("cpu") and extension.cpu_available() is None)


class Int8Weight:
    """The packed int8 weight of one Linear (`packs(weight, parts)`: per row block of the weight when cut into
    `parts`), rebuilt when the weight is another tensor, its storage moved, its version counter or the count of
    optimizer steps changed. asym: activations quantized with a zero point per row (else symmetric).
    Not copied by deepcopy or pickle (a copy packs its own weight at first use)."""

    __slots__ = ("asym", "ref", "key", "packed")

    def __init__(self, asym: bool = True):
        self.asym = bool(asym)
        self.ref, self.key, self.packed = None, None, {}

    def packs(self, w: torch.Tensor, parts: int = 1) -> tuple[torch.Tensor, ...]:
        key = (w.data_ptr(), w._version, optimizer_steps())  # (a resize or move changes the pointer or the version)
        if self.ref is None or self.ref() is not w or self.key != key:
            self.packed, self.ref, self.key = {}, weakref.ref(w), key
        got = self.packed.get(parts)
        if got is None:
            with torch.no_grad():
                blocks = w.detach().view(parts, w.shape[0] // parts, w.shape[1]).unbind(0)
                got = self.packed[parts] = tuple(pack_int8(b) for b in blocks)
        return got

    def linear(self, w: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None = None,
               accumulate: bool = False, gelu: str | None = None) -> torch.Tensor:
        """act(x @ W.T + bias (+ out when accumulate)) on the int8 weight: x (..., in) fp32 -> (..., out) fp32,
        into `out` when given ((rows, out), unit column stride; 2-D x only), else a new tensor."""
        n, k = w.shape
        packed = self.packs(w)[0]
        if _direct(x):
            ext = extension.load()
            if torch.autograd.profiler._is_profiler_enabled:
                with torch.profiler.record_function(f"{EVENT} {x.shape[0]}x{k}x{n}"):
                    return ext.int8_linear(x, packed, n, bias, out, accumulate, gelu, self.asym, isa())
            return ext.int8_linear(x, packed, n, bias, out, accumulate, gelu, self.asym, isa())
        from fastenc import ops

        y = ops.int8_linear(x, packed, n, bias, residual=out if accumulate else None, gelu=gelu, asym=self.asym)
        return y if out is None else out.copy_(y)

    def planes(self, w: torch.Tensor, b: torch.Tensor | None, x: torch.Tensor, parts: int) -> tuple[torch.Tensor, ...]:
        """x @ W.T + bias cut into `parts` equal column blocks, each a contiguous (rows, out / parts) tensor: x
        quantized once, one int8 GEMM per row block of the weight. x: (rows, in) fp32."""
        n = w.shape[0] // parts
        packs = self.packs(w, parts)
        biases = (None,) * parts if b is None else b.view(parts, n).unbind(0)
        if not _direct(x):
            from fastenc import ops

            return tuple(ops.int8_linear(x, p, n, bi, asym=self.asym) for p, bi in zip(packs, biases))
        ext = extension.load()
        q, scale, zero = ext.int8_quantize_rows(x, self.asym)
        out = extension.buffer_empty((parts, x.shape[0], n), x)
        outs = out.unbind(0) if out is not None else (None,) * parts
        path = isa()
        with (torch.profiler.record_function(f"{EVENT} {x.shape[0]}x{w.shape[1]}x{w.shape[0]}")
              if torch.autograd.profiler._is_profiler_enabled else contextlib.nullcontext()):
            return tuple(ext.int8_gemm(q, scale, zero, p, n, w.shape[1], bi, o, False, None, path)
                         for p, bi, o in zip(packs, biases, outs))

    def __deepcopy__(self, memo):
        return Int8Weight(self.asym)

    def direct(self, ext, w: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None,
               accumulate: bool, gelu: str | None, path: str) -> torch.Tensor:
        """linear() with the checks a forward's fastenc.ops.direct.Plan has already made (x a contiguous fp32 CPU
        (rows, in) tensor, the cpu backend chosen, the extension `ext` loaded) and the int8 path `path` (isa())
        read once per forward: the extension call alone."""
        return ext.int8_linear(x, self.packs(w)[0], w.shape[0], bias, out, accumulate, gelu, self.asym, path)

    def __reduce__(self):
        return (Int8Weight, (self.asym,))
