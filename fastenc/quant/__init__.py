"""int8 inference on CPU: `quantize(model, "int8")` / `dequantize(model)` (model.py), the int8 form of a Linear
(int8.py: Int8Weight, pack_int8), and the run-time choice of the int8 GEMM's instruction set (isa.py). The op is
fastenc.ops.int8_linear, its reference fastenc.reference.int8_linear, its kernels csrc/cpu/int8_linear*.cpp."""
from fastenc.quant.int8 import Int8Weight, pack_int8
from fastenc.quant.model import QuantMixin, dequantize, encoder_linears, is_quantized, quantize, quantized_layers

__all__ = ["quantize", "dequantize", "is_quantized", "quantized_layers", "encoder_linears", "pack_int8", "Int8Weight",
           "QuantMixin"]
