"""The CPU inference form of a model's layer loop, decided once per forward (`Plan.make`).

A public op (fastenc.ops.layer_norm, gelu, attention) checks its arguments, asks the registry for a backend, goes
through the torch.library dispatcher and returns empty placeholders for the outputs it does not compute: ~60-80 us
of host work per call, several times the kernel itself at batch 1 x 16 tokens, paid by every op of every layer.
A Plan does that work once per forward instead: it validates cu_seqlens once, asks the registry once per op with
the forward's own inputs (so use_backend(...) / FASTENC_BACKEND / an unsupported input still decide), and, when
the cpu backend serves all its ops, the layer loop of that same forward calls the cpu kernels directly with the
tensors the model built itself. A Plan is made by the forward that uses it and dropped with it (never kept across
calls: a later call may come with other inputs, another backend choice or grad mode on).

When a Plan is made (`make`): grad mode off (torch.no_grad / inference_mode), not under torch.compile tracing, x a
contiguous fp32 CPU (tokens, hidden) tensor, and the registry choosing the cpu backend for layer_norm, attention
and gelu (post-norm BERT blocks) or rope and geglu (pre-norm ModernBERT blocks, `pre_norm_block`) on these inputs. Otherwise None, and the caller runs the public ops (which raise what they raise).
Under the profiler each direct call is recorded under its op's name (fastenc::layer_norm, ...).

The QKV projection is one GEMM (tokens, 3 * hidden) whose q, k and v column blocks the attention kernel reads in
place (its input row stride is 3 * hidden): at 16 tokens one N = 3 * hidden GEMM is ~1.1-1.6x faster than three
N = hidden ones (MKL and oneDNN, one and two threads). The MLP's first projection adds its bias and applies GELU in
the panel GEMM's epilogue (`linear_gelu`). A model may make the Plan on its embeddings' sum and run the embeddings'
LayerNorm through it too (`embed_norm`: BERT's). ModernBERT's blocks (`pre_norm_block`): q and k rotated by the
RoPE kernel into new tensors (v copied by the attention kernel, its strides then differing from theirs), the local
layers' window passed to the attention kernel, GeGLU written over the input half of Wi's output, and Wo's and the
MLP's output projections accumulated into the residual stream in place.
"""
from __future__ import annotations

import contextlib
import math

import torch

from fastenc import extension, registry
from fastenc.layers import prepack
from fastenc.layers.linear import Linear
from fastenc.ops._common import check_cu_seqlens


class Plan:
    """The direct cpu-kernel calls of one forward's layer loop (see the module docstring)."""

    __slots__ = ("ext", "cu_seqlens", "max_seqlen", "record")

    def __init__(self, ext, cu_seqlens: torch.Tensor, max_seqlen: int, record: bool):
        self.ext, self.cu_seqlens, self.max_seqlen, self.record = ext, cu_seqlens, max_seqlen, record

    @staticmethod
    def make(x: torch.Tensor, cu_seqlens: torch.Tensor, heads: int, norm, rope: tuple | None = None) -> "Plan | None":
        """A Plan for layers over x (tokens, hidden) split into `heads` heads, with LayerNorms like `norm`, or None
        when the direct form does not apply. cu_seqlens (int32 (batch+1,)) is validated here, once.
        rope (cos, sin, positions): pre-norm GeGLU blocks with RoPE (ModernBERT's, `pre_norm_block`): the registry
        is asked for rope and geglu instead of gelu."""
        if (torch.is_grad_enabled() or torch.compiler.is_compiling() or x.device.type != "cpu"
                or x.dtype != torch.float32 or x.dim() != 2 or not x.is_contiguous() or x.shape[0] == 0
                or x.shape[1] % heads):
            return None
        t = x.shape[0]
        cu = check_cu_seqlens(cu_seqlens, t, x.device)
        longest = max(b - a for a, b in zip(cu, cu[1:]))
        qkv = x.view(t, heads, x.shape[1] // heads)
        asks = (("layer_norm", {"x": x, "weight": norm.weight, "bias": norm.bias, "residual": None}),
                ("attention", {"q": qkv, "k": qkv, "v": qkv, "cu_seqlens": cu_seqlens, "max_seqlen": longest,
                               "window": (-1, -1), "scale": 1.0, "dropout_p": 0.0}))
        if rope is None:
            asks += (("gelu", {"x": x, "bias": None}),)
        else:
            cos, sin, pos = rope
            asks += (("rope", {"q": qkv, "k": qkv, "cos": cos, "sin": sin, "positions": pos}),
                     ("geglu", {"x": x}))
        try:
            if any(registry.select(op, inputs).backend != "cpu" for op, inputs in asks):
                return None
        except ValueError:  # no backend for these inputs: the public ops say why
            return None
        return Plan(extension.load(), cu_seqlens, longest, torch.autograd.profiler._is_profiler_enabled)

    def _named(self, name: str):
        return torch.profiler.record_function(name) if self.record else contextlib.nullcontext()

    def qkv_attention(self, wqkv: Linear, x: torch.Tensor, heads: int, window=None) -> torch.Tensor:
        """Attention of x (tokens, hidden) through the fused Wqkv (3 * hidden, hidden), rows [q; k; v]: one GEMM,
        the kernel reading q, k, v in place. -> (tokens, hidden), before the output projection."""
        t, hidden = x.shape
        w, b = wqkv.weight, wqkv.bias
        if prepack.use_panels(x, w):
            y = prepack.panel_gemm(x, wqkv._packed(w, panels=True)[0], 3 * hidden, b,
                                   extension.buffer_empty((t, 3 * hidden), x))
        elif prepack.use_packed(x, w):
            y = prepack.linear(x, wqkv._packed(w)[0], b)
        else:
            y = extension.buffer_empty((t, 3 * hidden), x)
            wt = wqkv._views(1).wt[0]
            if b is None:
                torch.mm(x, wt, out=y)
            else:
                torch.addmm(b, x, wt, out=y)
        q, k, v = y.view(t, 3, heads, hidden // heads).unbind(1)
        wl, wr = (-1, -1) if window is None else window
        with self._named("fastenc::attention"):
            o = self.ext.attention(q, k, v, self.cu_seqlens, self.max_seqlen, wl, wr,
                                   1.0 / math.sqrt(hidden // heads), 0.0, 0, 0)[0]
        return o.view(t, hidden)

    def layer_norm(self, norm, x: torch.Tensor, input_bias: torch.Tensor | None) -> torch.Tensor:
        """LayerNorm(x + input_bias) -> a new (tokens, hidden) tensor (the sum is not kept: post-norm blocks)."""
        with self._named("fastenc::layer_norm"):
            return self.ext.layer_norm(x, norm.weight, norm.bias, None, input_bias, norm.eps, False, False)[0]

    def embed_norm(self, norm, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """LayerNorm(x + residual) -> a new (tokens, hidden) tensor (the embeddings' sum: not kept)."""
        with self._named("fastenc::layer_norm"):
            return self.ext.layer_norm(x, norm.weight, norm.bias, residual, None, norm.eps, False, False)[0]

    def linear_gelu(self, fc: Linear, x: torch.Tensor, approximate: str) -> torch.Tensor:
        """gelu(fc(x)) (the MLP's first projection): x (tokens, in) -> (tokens, out). On the panel GEMM
        (prepack.use_panels) the bias and the GELU are its epilogue (no second pass over the output); else the
        GEMM, then gelu(h + bias) in place."""
        w = fc.weight
        if prepack.use_panels(x, w):
            return prepack.panel_gemm(x, fc._packed(w, panels=True)[0], fc.out_features, fc.bias,
                                      extension.buffer_empty((x.shape[0], fc.out_features), x), gelu=approximate)
        h = fc(x, with_bias=False)
        with self._named("fastenc::gelu_out"):
            self.ext.gelu_out(h, fc.bias, approximate, h)
        return h


def pre_norm_block(plan: Plan, layer, h: torch.Tensor, rope: tuple, approximate: str) -> torch.Tensor:
    """One pre-norm GeGLU block with RoPE (ModernBERT's ModernBertLayer, eval, no dropout) through the Plan, the
    residual stream h (tokens, hidden) updated in place and returned:
    h += Wo(attention(rope(q, k), v)) of LayerNorm(h) (layer 0 has no norm there); h += Wo(geglu(Wi(LayerNorm(h)))).
    rope: (cos, sin, positions int32 (tokens,)) of this layer's type."""
    a, mlp = layer.attn, layer.mlp
    t, hidden = h.shape
    y = h if layer.attn_norm is None else plan.layer_norm(layer.attn_norm, h, None)
    w = a.Wqkv.weight
    if prepack.use_panels(y, w):
        qkv = prepack.panel_gemm(y, a.Wqkv._packed(w, panels=True)[0], 3 * hidden, a.Wqkv.bias,
                                 extension.buffer_empty((t, 3 * hidden), y))
    else:
        qkv = a.Wqkv(y)
    q, k, v = qkv.view(t, 3, a.heads, hidden // a.heads).unbind(1)
    cos, sin, pos = rope
    with plan._named("fastenc::rope"):
        q, k = plan.ext.rope(q, k, cos, sin, pos)
    wl, wr = (-1, -1) if a.window is None else a.window
    with plan._named("fastenc::attention"):
        o = plan.ext.attention(q, k, v, plan.cu_seqlens, plan.max_seqlen, wl, wr,
                               1.0 / math.sqrt(hidden // a.heads), 0.0, 0, 0)[0]
    _accumulate(a.Wo, o.view(t, hidden), h)
    hi = mlp.Wi(plan.layer_norm(layer.mlp_norm, h, None))
    n = hi.shape[1] // 2
    g = hi[:, :n]
    with plan._named("fastenc::geglu"):
        plan.ext.geglu_out(hi, approximate, g)
    _accumulate(mlp.Wo, g, h)
    return h


def _accumulate(linear: Linear, x: torch.Tensor, out: torch.Tensor) -> None:
    """out += linear(x), bias included, in place."""
    linear.accumulate_(x, out)
    if linear.bias is not None:
        out.add_(linear.bias)
