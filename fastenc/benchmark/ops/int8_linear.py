"""int8_linear benchmark spec: the int8 linear layer (x quantized per row, int8 weight per channel) at BERT-base's MLP
(768 -> 3072 with the GELU fused, 3072 -> 768) at 8 x 128 and at batch 1 x 16, against the fp32 linear in torch and
torch's dynamic int8 linear. Bytes: x read once (fp32), the int8 weight once, y written once (fp32); FLOPs 2 t i o."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import fastenc
from fastenc.benchmark.ops._common import BERT, COMPUTE, HIDDEN, Case, OpInputs, batch, rand
from fastenc.quant import pack_int8
from fastenc.reference.int8_linear import int8_linear_ref

OP, ORDER, BOUND = "int8_linear", 95, COMPUTE
BASELINES = ("torch-fp32", "torch-dynamic-int8")
NOT_COMPILED = "int8 inference op: the baselines are torch's fp32 and dynamic int8 linears"


def cases() -> list[Case]:
    up, down = {"in": HIDDEN, "out": 4 * HIDDEN, "gelu": "none"}, {"in": 4 * HIDDEN, "out": HIDDEN, "gelu": None}
    return [Case(OP, "bert-base fc1+gelu 8x128 768->3072", "BERT-base MLP", BERT, up, quick=True),
            Case(OP, "bert-base fc2 8x128 3072->768", "BERT-base MLP", BERT, down),
            Case(OP, "bert-base fc1+gelu 1x16 768->3072", "BERT-base batch 1", batch(1, 16), up, quick=True)]


def work(case: Case, e: int) -> tuple[int, int]:
    i, o, t = case.dims["in"], case.dims["out"], case.tokens
    return t * i * 4 + o * i + o * 4 + t * o * 4, 2 * t * i * o


def setup(case: Case, dev, dtype, g, seed: int) -> OpInputs:
    i, o, gelu = case.dims["in"], case.dims["out"], case.dims["gelu"]
    x = rand(case.tokens, i, device=dev, dtype=torch.float32, gen=g)
    w = rand(o, i, device=dev, dtype=torch.float32, gen=g, scale=i ** -0.5)
    bias = rand(o, device=dev, dtype=torch.float32, gen=g)
    packed = pack_int8(w)

    def torch_fp32():
        y = F.linear(x, w, bias)
        return F.gelu(y) if gelu else y

    others = {"torch-fp32": torch_fp32}
    skipped = {}
    if torch.device(dev).type == "cpu":
        lin = torch.nn.Linear(i, o)
        with torch.no_grad():
            lin.weight.copy_(w)
            lin.bias.copy_(bias)
        q = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(lin), {torch.nn.Linear}, dtype=torch.qint8)

        def torch_int8():
            with torch.inference_mode():
                y = q(x)
            return F.gelu(y) if gelu else y
        others["torch-dynamic-int8"] = torch_int8
    else:
        skipped["torch-dynamic-int8"] = "torch's dynamic int8 linear runs on the CPU"
    return OpInputs(lambda be: (lambda: fastenc.ops.int8_linear(x, packed, o, bias, gelu=gelu, backend=be)),
                    {"x": x, "packed": packed, "n": o, "bias": bias, "residual": None, "gelu": gelu or "",
                     "asym": True},
                    others, (int8_linear_ref, x, packed, o, bias, None, gelu), skipped)
