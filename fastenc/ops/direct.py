"""The cpu kernels called without the dispatcher: the packed GEMM, and a forward's inference `Plan`.

A public op (fastenc.ops.layer_norm, gelu, attention) checks its arguments, asks the registry for a backend, goes
through the torch.library dispatcher and returns empty placeholders for the outputs it does not compute: ~60-80 us
of host work per call, several times the kernel itself at batch 1 x 16 tokens, paid by every op of every layer.
A Plan does that work once per forward instead: it validates cu_seqlens once, asks the registry once per op with
the forward's own inputs (so use_backend(...) / FASTENC_BACKEND / an unsupported input still decide), and, when
the cpu backend serves all its ops, the blocks of that same forward call the cpu kernels through it with the
tensors the model built itself. A Plan is made by the forward that uses it and dropped with it (never kept across
calls: a later call may come with other inputs, another backend choice or grad mode on). The layers take it as an
argument (SelfAttention.attend, LayerNorm, MLP.hidden, GeGLUMLP.gated): one definition of each block's math, the
plan choosing the kernels.

When a Plan is made (`make`): grad mode off (torch.no_grad / inference_mode), not under torch.compile tracing, x a
contiguous fp32 CPU (tokens, hidden) tensor, and the registry choosing the cpu backend for layer_norm, attention
and gelu (post-norm GELU blocks) or rope and geglu (pre-norm GeGLU blocks with RoPE) on these inputs. Otherwise
None, and the caller runs the public ops (which raise what they raise). Under the profiler each call is recorded
under its op's name (fastenc::layer_norm, ...).

The packed GEMM (csrc/cpu/gemm.cpp) multiplies by a weight packed once into 16-column panels (`gemm_pack`), with
the bias, an accumulation into its output and the MLP's GELU in its epilogue; fastenc.layers.prepack decides when
a Linear takes it. It is no registry op: its weight layout is its own, so there is no other backend to choose.
"""
from __future__ import annotations

import contextlib
import math

import torch

from fastenc import extension, registry
from fastenc.ops._common import check_cu_seqlens

GEMM_EVENT = "fastenc::gemm_packed"  # the profiler name of gemm_packed (followed by its M x K x N)


def gemm_pack(w: torch.Tensor) -> torch.Tensor:
    """w (n, k) fp32 contiguous -> its panels for gemm_packed."""
    return extension.load().gemm_pack(w)


def gemm_packed(x: torch.Tensor, panels: torch.Tensor, n: int, bias: torch.Tensor | None,
                out: torch.Tensor | None = None, accumulate: bool = False, gelu: str | None = None) -> torch.Tensor:
    """x @ W.T (+ bias) with W packed by gemm_pack (n rows): into `out` when given, added to it when accumulate;
    gelu ("none" | "tanh"): gelu of that, in the epilogue. Recorded as "fastenc::gemm_packed MxKxN" under the
    profiler (fastenc.benchmark.latency reads it)."""
    if torch.autograd.profiler._is_profiler_enabled:
        with torch.profiler.record_function(f"{GEMM_EVENT} {x.shape[0]}x{x.shape[1]}x{n}"):
            return extension.load().gemm_packed(x, panels, n, bias, out, accumulate, gelu)
    return extension.load().gemm_packed(x, panels, n, bias, out, accumulate, gelu)


class Plan:
    """The direct cpu-kernel calls of one forward's blocks (see the module docstring)."""

    __slots__ = ("ext", "cu_seqlens", "max_seqlen", "record")

    def __init__(self, ext, cu_seqlens: torch.Tensor, max_seqlen: int, record: bool):
        self.ext, self.cu_seqlens, self.max_seqlen, self.record = ext, cu_seqlens, max_seqlen, record

    @staticmethod
    def make(x: torch.Tensor, cu_seqlens: torch.Tensor, heads: int, norm, rope: tuple | None = None) -> "Plan | None":
        """A Plan for blocks over x (tokens, hidden) split into `heads` heads, with LayerNorms like `norm`, or None
        when the direct form does not apply. cu_seqlens (int32 (batch+1,)) is validated here, once.
        rope (cos, sin, positions): pre-norm GeGLU blocks with RoPE: the registry is asked for rope and geglu
        instead of gelu."""
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

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window=None) -> torch.Tensor:
        """Varlen attention of q, k, v (tokens, heads, head_dim), any row strides (e.g. column blocks of one fused
        QKV output, read in place) over this forward's sequences -> (tokens, heads, head_dim)."""
        wl, wr = (-1, -1) if window is None else window
        with self._named("fastenc::attention"):
            return self.ext.attention(q, k, v, self.cu_seqlens, self.max_seqlen, wl, wr,
                                      1.0 / math.sqrt(q.shape[-1]), 0.0, 0, 0)[0]

    def layer_norm(self, norm, x: torch.Tensor, residual: torch.Tensor | None = None,
                   input_bias: torch.Tensor | None = None) -> torch.Tensor:
        """LayerNorm(x + residual + input_bias) -> a new (tokens, hidden) tensor (the sum is not kept)."""
        with self._named("fastenc::layer_norm"):
            return self.ext.layer_norm(x, norm.weight, norm.bias, residual, input_bias, norm.eps, False, False)[0]

    def gelu_(self, h: torch.Tensor, bias: torch.Tensor | None, approximate: str) -> torch.Tensor:
        """h = gelu(h + bias), in place."""
        with self._named("fastenc::gelu_out"):
            self.ext.gelu_out(h, bias, approximate, h)
        return h

    def rope(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q and k rotated (new tensors)."""
        with self._named("fastenc::rope"):
            return self.ext.rope(q, k, cos, sin, positions)

    def geglu_(self, h: torch.Tensor, approximate: str) -> torch.Tensor:
        """gelu(input) * gate of h = [input, gate] (tokens, 2n), written over the input half -> that half."""
        g = h[:, :h.shape[1] // 2]
        with self._named("fastenc::geglu"):
            self.ext.geglu_out(h, approximate, g)
        return g
