"""The padding module (fastenc.ops._padding) under the models' package: PackedBatch, gather_rows, pad_input and
unpad_input are its objects, not copies."""
from fastenc.ops._padding import PackedBatch, gather_rows, pad_input, unpad_input

__all__ = ["PackedBatch", "gather_rows", "pad_input", "unpad_input"]
