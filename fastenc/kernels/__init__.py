"""Triton kernels, the triton backend's functions (fastenc.backends.triton resolves "fastenc.kernels.<op>", name at
the first call). One module per op: layer_norm, rms_norm, norm_bwd (their backward), gelu, geglu, swiglu, rope, attention,
attention_bwd, merge_lora, lora_linear, dropout; shared: _util (launch helpers), _compile (ahead-of-time compile
of every kernel for a GPU target, without a GPU).
Nothing here touches a GPU at import.
"""
