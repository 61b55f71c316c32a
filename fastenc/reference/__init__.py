"""Pure-PyTorch references (fp32 math): the test oracle, the benchmark baseline, the reference backend's
functions (any device). One module per op, forward and backward: layer_norm (norm_bwd), rms_norm, gelu, geglu, swiglu, rope,
attention (varlen), attention_bwd, attention_dropout, merge_lora, lora_linear, dropout, int8_linear.
"""
from fastenc.reference.layer_norm import layer_norm_ref, norm_bwd_ref, norm_stats_ref
from fastenc.reference.rms_norm import rms_norm_ref
from fastenc.reference.gelu import gelu_bwd_ref, gelu_ref
from fastenc.reference.geglu import geglu_bwd_ref, geglu_ref
from fastenc.reference.swiglu import swiglu_bwd_ref, swiglu_ref
from fastenc.reference.rope import rope_bwd_ref, rope_cache, rope_ref
from fastenc.reference.attention import attention_ref, attention_varlen_ref
from fastenc.reference.merge_lora import merge_lora_ref
from fastenc.reference.dropout import dropout_bwd_ref, dropout_ref
from fastenc.reference.lora_linear import lora_linear_bwd_ref, lora_linear_ref
from fastenc.reference.int8_linear import int8_linear_ref, quantize_rows_ref, quantize_weight_ref
from fastenc.reference.sparse_max import sparse_max_ref

__all__ = ["layer_norm_ref", "rms_norm_ref", "gelu_ref", "gelu_bwd_ref", "geglu_ref", "geglu_bwd_ref", "swiglu_ref",
           "swiglu_bwd_ref", "rope_cache",
           "rope_ref", "rope_bwd_ref", "attention_ref", "attention_varlen_ref", "merge_lora_ref", "lora_linear_ref",
           "norm_bwd_ref", "norm_stats_ref", "lora_linear_bwd_ref", "dropout_ref", "dropout_bwd_ref",
           "int8_linear_ref", "quantize_rows_ref", "quantize_weight_ref", "sparse_max_ref"]
