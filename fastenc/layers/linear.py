"""Linear layer holding plain `weight` (out, in) and `bias` (out,) tensors: one GEMM through torch (MKL/cuBLAS).

Kept deliberately plain so adapters (LoRA) can be merged into `weight` in place, and so the bias can be left
out of the GEMM when the next op fuses it (`forward(x, with_bias=False)` then e.g. ops.gelu(y, bias)).
On CPU the output comes from fastenc's buffer cache (fastenc.extension.buffer_empty) once the extension's cpu half
is loaded and the registry allows the cpu backend for the call (not under use_backend("reference")), so a model's
layers reuse the same memory instead of faulting in fresh pages for every GEMM output. That reuse is an inference
form: when autograd records the call (grad mode on and x, weight or bias requiring grad) the output is a new tensor.
The parameters require grad, as torch.nn.Linear's do.
In inference on CPU (fp32, grad off: fastenc.layers.prepack.use_panels) the GEMM runs on a packed copy of the weight
(fastenc's panels, or oneDNN's layout while the extension is not loaded: prepack.gemm_path; from 128 rows torch's
own GEMM where it measured faster: prepack.panels_chosen), built at first use and rebuilt when the weight changes; `weight` itself stays the plain tensor that state_dict, LoRA merge and training
see.
"""
from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch import nn

from fastenc import extension, registry
from fastenc.ops._common import needs_grad
from fastenc.layers import prepack


class Linear(nn.Module):
    """y = x @ weight.T (+ bias). x: (..., in_features) -> (..., out_features), any float dtype of the weight.
    int8: the layer's int8 form (fastenc.quant.Int8Weight) once fastenc.quantize chose it for this layer: every call
    then runs the int8 GEMM (CPU fp32 inference only); None: fp32."""

    int8 = None

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(out_features, device=device, dtype=dtype)) if bias else None

    def forward(self, x: torch.Tensor, with_bias: bool = True) -> torch.Tensor:
        bias = self.bias if with_bias else None
        w = self.weight
        if self.int8 is not None:
            return self._int8().linear(w, x, bias)
        path = prepack.gemm_path(x, w)
        if path == "panels":
            return prepack.panel_gemm(x, self._packed(w, panels=True)[0], self.out_features, bias,
                                      extension.buffer_empty((x.shape[0], self.out_features), x))
        if path == "onednn":
            return prepack.linear(x, self._packed(w)[0], bias)
        if (x.device.type == "cpu" and x.dim() == 2 and x.dtype == w.dtype and w.device.type == "cpu"
                and registry.backend_allowed("cpu") and not needs_grad(x, w, bias)):
            out = extension.buffer_empty((x.shape[0], self.out_features), x)
            if out is not None:
                wt = self._views(1).wt[0]
                return torch.mm(x, wt, out=out) if bias is None else torch.addmm(bias, x, wt, out=out)
        return F.linear(x, w, bias)

    def _apply(self, fn, *args, **kwargs):
        # .to() / .cuda() / .double() put new tensors in place of the parameters: drop the views (and the pack) of
        # the old ones now rather than at the next inference call, so the old storage is not kept alive by them.
        self.__dict__.pop("_view_cache", None)
        self.__dict__.pop("_pack", None)
        self.__dict__.pop("_panels", None)
        return super()._apply(fn, *args, **kwargs)

    def _int8(self):
        """The int8 form, after checking the call is one it serves (eval mode, CPU fp32 input)."""
        if self.training:
            raise RuntimeError("Linear: this layer is int8-quantized (inference only) but in train mode; call "
                               "fastenc.dequantize(model) to train, or model.eval()")
        return self.int8

    def _views(self, parts: int) -> "_Views":
        """The per-part weight.T and bias views of an inference call (kept between calls, see _Views)."""
        cache = self.__dict__.get("_view_cache")
        if cache is None:
            cache = self.__dict__["_view_cache"] = _Views()
        return cache.get(self.weight, self.bias, parts)

    def _packed(self, w: torch.Tensor, parts: int = 1, panels: bool = False) -> tuple[torch.Tensor, ...]:
        """w packed for oneDNN (prepack.linear) or, panels=True, for fastenc's panel GEMM (prepack.panel_gemm)."""
        key = "_panels" if panels else "_pack"
        cache = self.__dict__.get(key)
        if cache is None:  # (kept out of __init__: a subclass or a copy made without it still packs)
            cache = self.__dict__[key] = prepack.PackCache(panels)
        return cache.get(w, parts)

    def planes(self, x: torch.Tensor, parts: int) -> tuple[torch.Tensor, ...]:
        """x @ weight.T (+ bias) cut into `parts` equal column blocks, each a contiguous (tokens, out/parts)
        tensor (e.g. q, k, v of a fused QKV projection, each a GEMM of its own row block of the weight, so no
        block is left interleaved per token). CPU; x: (tokens, in). An inference form (the planes may come from the
        buffer cache): the caller takes it only when autograd does not record the call."""
        w = self.weight
        if self.int8 is not None:
            return self._int8().planes(w, self.bias, x, parts)
        views = self._views(parts)
        path = prepack.gemm_path(x, w)
        if path == "panels":
            n = self.out_features // parts
            out = extension.buffer_empty((parts, x.shape[0], n), x)
            outs = out.unbind(0) if out is not None else (None,) * parts
            return tuple(prepack.panel_gemm(x, pw, n, bi, o)
                         for pw, bi, o in zip(self._packed(w, parts, panels=True), views.b, outs))
        if path == "onednn":
            return tuple(prepack.linear(x, pw, bi) for pw, bi in zip(self._packed(w, parts), views.b))
        shape = (parts, x.shape[0], self.out_features // parts)
        out = extension.buffer_empty(shape, x) if registry.backend_allowed("cpu") else None
        if out is None:
            out = x.new_empty(shape)
        outs = out.unbind(0)
        for o, wt, bi in zip(outs, views.wt, views.b):
            if bi is None:
                torch.mm(x, wt, out=o)
            else:
                torch.addmm(bi, x, wt, out=o)
        return outs

    def gelu_epilogue(self, x: torch.Tensor, approximate: str) -> torch.Tensor | None:
        """gelu(x @ weight.T + bias) with the bias and the GELU ("none" | "tanh") in the panel GEMM's epilogue, or
        None where that GEMM does not run (prepack.use_panels) or has no such GELU (quick: the caller runs the GEMM,
        then the GELU kernel)."""
        if approximate not in ("none", "tanh"):
            return None
        w = self.weight
        if self.int8 is not None:
            return self._int8().linear(w, x, self.bias, extension.buffer_empty((x.shape[0], self.out_features), x),
                                       gelu=approximate)
        if prepack.gemm_path(x, w) != "panels":
            return None
        return prepack.panel_gemm(x, self._packed(w, panels=True)[0], self.out_features, self.bias,
                                  extension.buffer_empty((x.shape[0], self.out_features), x), gelu=approximate)

    def output_bias(self) -> torch.Tensor | None:
        """The bias forward() adds (a caller that runs forward(x, with_bias=False) fuses this one elsewhere)."""
        return self.bias

    def accumulate_(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """out += x @ weight.T (no bias), in place: one GEMM with beta = 1, so a residual sum needs no pass of its
        own and the output buffer is not zeroed first. x: (tokens, in); out: (tokens, out_features).
        (fastenc's panel GEMM when prepack.use_panels, else the plain GEMM: with beta = 1 it beats oneDNN's packed
        one, which cannot accumulate in place.)"""
        w = self.weight
        if self.int8 is not None:
            return self._int8().linear(w, x, None, out, accumulate=True)
        if prepack.gemm_path(x, w) == "panels" and out.dtype == torch.float32 and out.stride(-1) == 1:
            return prepack.panel_gemm(x, self._packed(w, panels=True)[0], self.out_features, None, out, True)
        if out.dtype == x.dtype == self.weight.dtype and out.device == x.device:
            wt = self.weight.t() if torch.is_grad_enabled() else self._views(1).wt[0]
            return out.addmm_(x, wt)
        return out.add_(F.linear(x, self.weight))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class _Views:
    """weight.T cut into `parts` column blocks ((in, out/parts) views) and the matching bias slices (None without a
    bias), made once instead of at every inference call (a view costs a dispatcher round trip; a layer makes several
    per call). Only for calls autograd does not record: views made with grad off carry no grad history. Rebuilt when
    the weight or bias is another tensor or its storage moved (a replaced parameter, `.data =`, `.to()`, a dtype
    change); an in-place write (LoRA merge, load_state_dict, an optimizer step) shows through the views. The cached
    views keep the storage they view alive, so an equal data pointer is the same storage. Not copied by deepcopy or
    pickle (a copy starts empty)."""

    __slots__ = ("refs", "key", "wt", "b")

    def __init__(self):
        self.refs, self.key, self.wt, self.b = (None, None), None, (), ()

    def get(self, w: torch.Tensor, b: torch.Tensor | None, parts: int) -> "_Views":
        key = (parts, w.data_ptr(), None if b is None else b.data_ptr())
        rw, rb = self.refs
        if (key != self.key or rw is None or rw() is not w or (b is None) != (rb is None)
                or (b is not None and rb() is not b)):
            n = w.shape[0] // parts
            with torch.no_grad():
                self.wt = tuple(p.t() for p in w.view(parts, n, w.shape[1]).unbind(0))
                self.b = (None,) * parts if b is None else tuple(b.view(parts, n).unbind(0))
            self.refs = (weakref.ref(w), None if b is None else weakref.ref(b))
            self.key = key
        return self

    def __deepcopy__(self, memo):
        return _Views()

    def __reduce__(self):
        return (_Views, ())
