"""Feed-forward blocks: fc1 -> GELU -> fc2 (BERT, ViT) with the fc1 bias fused into the activation, and
ModernBERT's GeGLU: Wi -> (input, gate) -> gelu(input) * gate -> Wo, and the gated MLP of GTE / NomicBERT (GatedMLP:
act(gate) * up with a GELU (GeGLU) or SiLU (SwiGLU) activation)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fastenc import ops
from fastenc.layers.linear import Linear
from fastenc.ops._common import needs_grad

# Hugging Face activation names -> (fastenc GELU approximation or None, torch fallback).
_ACTS = {
    "gelu": ("none", None),
    "gelu_python": ("none", None),
    "gelu_new": ("tanh", None),
    "gelu_pytorch_tanh": ("tanh", None),
    "gelu_fast": ("tanh", None),
    "quick_gelu": ("quick", None),  # CLIP's x * sigmoid(1.702 x)
    "relu": (None, F.relu),
    "silu": (None, F.silu),
    "swish": (None, F.silu),
    "tanh": (None, torch.tanh),
}


def activation(name: str, x: torch.Tensor, bias: torch.Tensor | None = None, inplace: bool = False) -> torch.Tensor:
    """act(x + bias) for a Hugging Face activation name; the GELUs run fused in fastenc.ops.gelu.
    inplace: x is a temporary the caller no longer needs, overwritten with the result (contiguous x); an inference
    form, ignored when autograd records the call (x or bias requires grad)."""
    if name not in _ACTS:
        raise ValueError(f"activation: unsupported activation {name!r}; supported: {sorted(_ACTS)}")
    approx, fn = _ACTS[name]
    if approx is not None:
        out = x if inplace and x.is_contiguous() and not needs_grad(x, bias) else None
        return ops.gelu(x, bias=bias, approximate=approx, out=out)
    return fn(x if bias is None else x + bias)


def check_activation(name: str) -> str:
    if name not in _ACTS:
        raise ValueError(f"unsupported activation {name!r}; supported: {sorted(_ACTS)}")
    return name


class MLP(nn.Module):
    """fc2(act(fc1(x))). x: (tokens, hidden) -> (tokens, hidden); the fc1 GEMM runs without bias and the
    bias is added inside the activation kernel, which overwrites the GEMM output in place (one pass over the
    (tokens, intermediate) tensor and no second one held). forward(x, out_bias=False) leaves fc2's bias to the
    caller (fused into the next LayerNorm as its input_bias)."""

    def __init__(self, hidden: int, intermediate: int, act: str = "gelu", bias: bool = True, device=None, dtype=None):
        super().__init__()
        self.act = check_activation(act)
        self.fc1 = Linear(hidden, intermediate, bias=bias, device=device, dtype=dtype)
        self.fc2 = Linear(intermediate, hidden, bias=bias, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, out_bias: bool = True) -> torch.Tensor:
        return self.fc2(self.hidden(x), with_bias=out_bias)

    def hidden(self, x: torch.Tensor, plan=None) -> torch.Tensor:
        """act(fc1(x)): (tokens, intermediate), the input of fc2. plan: the forward's fastenc.ops.direct.Plan (GELU
        activations only) or None: with it, the bias and the GELU in the panel GEMM's epilogue where that GEMM
        runs (no second pass over the output), else the GEMM, then the GELU kernel in place."""
        if plan is not None:
            approx = _ACTS[self.act][0]
            h = self.fc1.gelu_epilogue(x, approx)
            return plan.gelu_(self.fc1(x, with_bias=False), self.fc1.bias, approx) if h is None else h
        h = self.fc1(x, with_bias=False)
        return activation(self.act, h, self.fc1.output_bias(), inplace=True)


class GeGLUMLP(nn.Module):
    """ModernBERT's GLU: input, gate = Wi(x).chunk(2); Wo(gelu(input) * gate). x: (tokens, hidden).
    Without autograd recording, the GeGLU writes over the input half of Wi's output (no new (tokens, intermediate)
    buffer) and Wo reads those rows in place (row stride 2 * intermediate). dropout: applied to gelu(input) * gate
    in training mode (ModernBERT's mlp_dropout)."""

    def __init__(self, hidden: int, intermediate: int, act: str = "gelu", bias: bool = False, device=None, dtype=None,
                 dropout: float = 0.0):
        super().__init__()
        self.dropout = float(dropout)
        approx = _ACTS.get(check_activation(act))[0]
        if approx is None:
            raise ValueError(f"GeGLUMLP: the gated unit needs a GELU activation, got {act!r}")
        self.approximate = approx
        self.Wi = Linear(hidden, 2 * intermediate, bias=bias, device=device, dtype=dtype)
        self.Wo = Linear(intermediate, hidden, bias=bias, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, out_bias: bool = True) -> torch.Tensor:
        return self.Wo(self.gated(x), with_bias=out_bias)

    def gated(self, x: torch.Tensor, plan=None) -> torch.Tensor:
        """drop(gelu(input) * gate) of Wi(x): (tokens, intermediate), the input of Wo. plan: the forward's
        fastenc.ops.direct.Plan (eval mode) or None."""
        h = self.Wi(x)
        if plan is not None:
            return plan.geglu_(h, self.approximate)
        n = h.shape[-1] // 2
        out = h[..., :n] if h.is_contiguous() and not needs_grad(h) else None
        g = ops.geglu(h, approximate=self.approximate, out=out)
        if self.training and self.dropout > 0:
            g = F.dropout(g, self.dropout, training=True)
        return g


class GatedMLP(nn.Module):
    """Wo(drop(act(gate) * up)) with gate, up = Wi(x).chunk(2) (gate FIRST, the order of fastenc.ops.geglu and
    fastenc.ops.swiglu): GTE's and NomicBERT's MLP (their separate gate_proj and up_proj fused into one Wi by the
    weight map). act: a GELU name (fastenc.ops.geglu) or silu / swish (fastenc.ops.swiglu). x: (tokens, hidden) ->
    (tokens, hidden). bias: Wi's bias; out_bias: Wo's. dropout: on act(gate) * up in training mode."""

    def __init__(self, hidden: int, intermediate: int, act: str = "silu", bias: bool = False, out_bias: bool = True,
                 dropout: float = 0.0, device=None, dtype=None):
        super().__init__()
        self.act = check_activation(act)
        approx = _ACTS[act][0]
        if approx is None and act not in ("silu", "swish"):
            raise ValueError(f"GatedMLP: act must be a GELU or silu/swish, got {act!r}")
        self.approximate = approx  # None: SwiGLU
        self.dropout = float(dropout)
        self.Wi = Linear(hidden, 2 * intermediate, bias=bias, device=device, dtype=dtype)
        self.Wo = Linear(intermediate, hidden, bias=out_bias, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, out_bias: bool = True) -> torch.Tensor:
        return self.Wo(self.gated(x), with_bias=out_bias)

    def gated(self, x: torch.Tensor) -> torch.Tensor:
        """drop(act(gate) * up) of Wi(x): (tokens, intermediate), the input of Wo."""
        h = self.Wi(x)
        if self.approximate is None:
            g = ops.swiglu(h)
        else:
            g = ops.geglu(h, approximate=self.approximate)
        if self.training and self.dropout > 0:
            g = F.dropout(g, self.dropout, training=True)
        return g
