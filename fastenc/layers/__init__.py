"""nn.Modules over fastenc.ops: the building blocks of fastenc.models (Linear with plain weight/bias, norms with
fused residual, GELU/GeGLU MLPs with fused bias+activation, fused-QKV varlen self-attention)."""
from fastenc.layers.linear import Linear
from fastenc.layers.norm import LayerNorm
from fastenc.layers.mlp import GeGLUMLP, MLP, activation
from fastenc.layers.attention import SelfAttention

__all__ = ["Linear", "LayerNorm", "MLP", "GeGLUMLP", "activation", "SelfAttention"]
