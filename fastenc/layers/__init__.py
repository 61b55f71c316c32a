"""nn.Modules over fastenc.ops, the building blocks of fastenc.models:
  linear     Linear with plain weight/bias (LoRA merges into it); CPU inference on packed weights
  prepack    when a Linear's GEMM runs on a packed weight, and the pack cache
  norm       LayerNorm with the residual add and the previous linear's bias fused in
  mlp        GELU MLP (bias + activation fused), ModernBERT's GeGLU MLP, the GeGLU/SwiGLU GatedMLP
  attention  fused-QKV varlen self-attention (RoPE, sliding windows, first-rows-only queries)
  embedding  the token embedding lookup, its weight gradient from the CPU buffer cache
  dropout    dropout with the bias add fused
  steps      the count of optimizer steps the weight caches key on
Each block's inference form takes the forward's fastenc.ops.direct.Plan as an argument (or None)."""
from fastenc.layers.linear import Linear
from fastenc.layers.norm import LayerNorm
from fastenc.layers.mlp import GatedMLP, GeGLUMLP, MLP, activation
from fastenc.layers.attention import SelfAttention

__all__ = ["Linear", "LayerNorm", "MLP", "GeGLUMLP", "GatedMLP", "activation", "SelfAttention"]
