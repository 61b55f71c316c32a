"""int8 quantization of a fastenc model, as an explicit and reversible choice: `quantize(model, "int8")` makes the
encoder's linear layers (every fastenc Linear inside `layers.<i>.`: attention QKV and output, MLP) run on int8
weights (per output channel) with activations quantized per row at run time; embeddings, norms, attention, softmax
and heads stay fp32. The fp32 weights stay the parameters (state_dict, save_pretrained and dequantize see them
unchanged); `dequantize(model)` returns the model to fp32 exactly. A quantized model is for CPU inference in fp32:
train mode, LoRA and other devices or dtypes are refused with the reason."""
from __future__ import annotations

import fnmatch
import re
from typing import Iterable

import torch
from torch import nn

from fastenc.layers.linear import Linear
from fastenc.quant.int8 import Int8Weight

MODES = ("int8",)
_ENCODER = re.compile(r"(^|\.)layers\.\d+\.")  # a module inside an encoder block


def _target(model: nn.Module) -> nn.Module:
    """The fastenc model behind `model`: itself, or the one a fastenc.accelerate module runs."""
    inner = model.__dict__.get("_fastenc")
    return inner if isinstance(inner, nn.Module) else model


def encoder_linears(model: nn.Module) -> dict[str, Linear]:
    """name -> each fastenc Linear inside an encoder block (`layers.<i>.` in its qualified name)."""
    return {name: m for name, m in _target(model).named_modules() if isinstance(m, Linear) and _ENCODER.search(name)}


def is_quantized(model: nn.Module) -> bool:
    """Whether any fastenc Linear of `model` runs on int8 weights."""
    return any(isinstance(m, Linear) and m.int8 is not None for m in _target(model).modules())


def quantized_layers(model: nn.Module) -> list[str]:
    """The qualified names of the Linears of `model` that run on int8 weights."""
    return [name for name, m in _target(model).named_modules() if isinstance(m, Linear) and m.int8 is not None]


def carry(old: nn.Module, new: nn.Module) -> None:
    """Quantize the same layers of `new` (a rebuild of `old`, e.g. after .to()) as `old`'s, with its settings."""
    for name, m in old.named_modules():
        if isinstance(m, Linear) and m.int8 is not None:
            new.get_submodule(name).int8 = Int8Weight(m.int8.asym)


def quantize(model: nn.Module, mode: str = "int8", *, keep: Iterable[str] = (), asym: bool = True) -> nn.Module:
    """Quantize the encoder's linear layers of a fastenc model (fastenc.from_hf / from_pretrained, or a module
    holding one, e.g. fastenc.accelerate's) in place and return it.

    mode: "int8" (per-output-channel symmetric int8 weights, activations quantized per row at run time).
    keep: layers kept in fp32, as names or fnmatch patterns of their qualified names (e.g. "layers.11.mlp.fc2",
    "*.mlp.fc2"); each must match at least one encoder layer. asym: activations with a per-row zero point (else
    symmetric). The model must be in eval mode, on the CPU, in fp32, without unmerged LoRA adapters (merge them
    first: merge_lora / merge_and_unload). Raises before any change on bad input."""
    if mode not in MODES:
        raise ValueError(f"quantize: mode must be one of {list(MODES)}, got {mode!r}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"quantize: model must be a torch.nn.Module (a fastenc model), got {type(model).__name__}")
    outer = model
    if isinstance(keep, str):
        keep = (keep,)
    keep = tuple(keep)
    if not all(isinstance(k, str) and k for k in keep):
        raise TypeError(f"quantize: keep must be layer names or patterns (non-empty strings), got {keep!r}")
    layers = encoder_linears(model)
    if not layers:
        raise ValueError(f"quantize: {type(model).__name__} has no fastenc encoder layers (layers.<i>.*); quantize a "
                         f"model from fastenc.from_hf / fastenc.from_pretrained")
    unmatched = [k for k in keep if not any(fnmatch.fnmatchcase(name, k) for name in layers)]
    if unmatched:
        raise ValueError(f"quantize: keep {unmatched} match no encoder layer; layers are named like "
                         f"{sorted(layers)[:4]}")
    model = _target(model)
    if model.training:
        raise ValueError("quantize: the model is in train mode; int8 is for inference: call model.eval() first")
    for name, m in layers.items():
        w = m.weight
        if w.device.type != "cpu" or w.dtype != torch.float32:
            raise ValueError(f"quantize: int8 runs on the CPU in fp32; {name}.weight is {str(w.dtype)[6:]} on "
                             f"{w.device} (call model.float().cpu() first)")
        if not bool(torch.isfinite(w).all()) or (m.bias is not None and not bool(torch.isfinite(m.bias).all())):
            raise ValueError(f"quantize: {name} holds NaN or infinity")
        if w.shape[1] > 65536:
            raise ValueError(f"quantize: {name} has {w.shape[1]} input features; the int8 GEMM takes up to 65536")
    unmerged = [name for name, m in model.named_modules() if type(m).__name__ == "LoraLinear"]
    if unmerged:
        raise ValueError(f"quantize: {unmerged[:3]} carry unmerged LoRA adapters; merge them first (merge_lora() or "
                         f"merge_and_unload()), then quantize")
    chosen = {name: m for name, m in layers.items() if not any(fnmatch.fnmatchcase(name, k) for k in keep)}
    packed = {name: Int8Weight(asym) for name in chosen}
    for name, m in chosen.items():  # pack everything before installing anything: a failure leaves the model as it was
        packed[name].packs(m.weight)
    for name, m in chosen.items():
        m.int8 = packed[name]
        for key in ("_pack", "_panels"):  # the fp32 packed copies are no longer used
            m.__dict__.pop(key, None)
    return outer


def dequantize(model: nn.Module) -> nn.Module:
    """Return a quantized model to fp32 (its parameters never changed): every Linear runs on its fp32 weight again."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"dequantize: model must be a torch.nn.Module, got {type(model).__name__}")
    for m in _target(model).modules():
        if isinstance(m, Linear):
            m.int8 = None
    return model


def refuse(model: nn.Module, what: str) -> None:
    """Raise when `model` is quantized: `what` (training, LoRA) needs the fp32 model."""
    if is_quantized(model):
        raise RuntimeError(f"{what}: the model is int8-quantized (inference only); call fastenc.dequantize(model) "
                           f"first (merge adapters into the fp32 model, then quantize again)")


class QuantMixin:
    """model.train() refused while quantized (the int8 layers have no backward); model.quantize / dequantize."""

    def train(self, mode: bool = True):
        if mode:
            refuse(self, f"{type(self).__name__}.train()")
        return super().train(mode)

    def quantize(self, mode: str = "int8", *, keep: Iterable[str] = (), asym: bool = True):
        """fastenc.quantize(self, mode, keep=, asym=)."""
        return quantize(self, mode, keep=keep, asym=asym)

    def dequantize(self):
        """fastenc.dequantize(self)."""
        return dequantize(self)
