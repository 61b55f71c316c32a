"""Public ops. Each is a torch.library custom op (`fastenc::<name>`) dispatching through fastenc.registry to a
backend's implementation; one module per op declares its custom ops, autograd, inputs' checks and, through
_backends.implement, each backend's function:
  layer_norm, rms_norm (backward: _norm_bwd), gelu, geglu, swiglu, rope, attention (backward: _attention_bwd),
  attention_qkv, merge_lora, lora_linear, dropout, int8_linear (inference), sparse_max (SPLADE weights, forward);
  shared: _common (input checks), _library; direct: the packed GEMM and the per-forward Plan of direct cpu-kernel
  calls.
"""
from fastenc.ops.layer_norm import layer_norm
from fastenc.ops.rms_norm import rms_norm
from fastenc.ops.gelu import gelu
from fastenc.ops.geglu import geglu
from fastenc.ops.swiglu import swiglu
from fastenc.ops.rope import rope, rope_cache
from fastenc.ops.attention import attention
from fastenc.ops.attention_qkv import attention_qkv
from fastenc.ops.merge_lora import merge_lora
from fastenc.ops.lora_linear import lora_linear
from fastenc.ops.dropout import dropout
from fastenc.ops.int8_linear import int8_linear
from fastenc.ops.sparse_max import sparse_max

__all__ = ["layer_norm", "rms_norm", "gelu", "geglu", "swiglu", "rope", "rope_cache", "attention", "attention_qkv",
           "merge_lora", "lora_linear", "dropout", "int8_linear", "sparse_max"]
