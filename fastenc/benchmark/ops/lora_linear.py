"""lora_linear benchmark spec: the unmerged LoRA projection x W^T + b + s (x A^T) B^T at BERT-base's QKV
(768 -> 2304, r 16) against PEFT's unmerged form in torch. FLOPs: forward 2 t (i o + r (i + o)); with W frozen the
backward adds dx 2 t (i o + r (i + o)) and dA, dB 2 t r (i + o): 4 t i o + 6 t r (i + o) in all."""
from __future__ import annotations

import torch.nn.functional as F

import fastenc
from fastenc import reference
from fastenc.benchmark.ops._common import (BERT, COMPUTE, HIDDEN, BwdCase, BwdInputs, Case, OpInputs,
                                           backward_hidden, backward_rows, grad_inputs, rand)

OP, ORDER, BOUND = "lora_linear", 90, COMPUTE


def cases() -> list[Case]:
    return [Case(OP, "bert-base qkv 8x128 768->2304 r16", "BERT-base + LoRA", BERT,
                 {"out": 3 * HIDDEN, "in": HIDDEN, "r": 16}, quick=True)]


def work(case: Case, e: int) -> tuple[int, int]:
    o, i, r, T = case.dims["out"], case.dims["in"], case.dims["r"], case.tokens
    return (T * (i + o) + o * i + o + r * (o + i)) * e, 2 * T * (i * o + r * (i + o))


def setup(case: Case, dev, dtype, g, seed: int) -> OpInputs:
    o, i, r = case.dims["out"], case.dims["in"], case.dims["r"]
    x = rand(case.tokens, i, device=dev, dtype=dtype, gen=g)
    w, bias = rand(o, i, device=dev, dtype=dtype, gen=g, scale=i ** -0.5), rand(o, device=dev, dtype=dtype, gen=g)
    a = rand(r, i, device=dev, dtype=dtype, gen=g, scale=i ** -0.5)
    bb = rand(o, r, device=dev, dtype=dtype, gen=g, scale=r ** -0.5)
    return OpInputs(lambda be: (lambda: fastenc.ops.lora_linear(x, w, bias, a, bb, 2.0, backend=be)),
                    {"x": x, "weight": w, "bias": bias, "lora_a": a, "lora_b": bb},
                    {"torch-eager": lambda: F.linear(x, w, bias) + 2.0 * F.linear(F.linear(x, a), bb)},
                    (reference.lora_linear_ref, x, w, bias, a, bb, 2.0))


def backward_case(quick: bool) -> BwdCase:
    rows, h, r = backward_rows(quick), backward_hidden(quick), 8 if quick else 16
    return BwdCase(OP, f"{rows} x {h}->{3 * h} r{r}", rows, {"in": h, "out": 3 * h, "r": r})


def backward_setup(case: BwdCase, device: str, dtype) -> BwdInputs:
    rnd, twin = grad_inputs(device, dtype)
    rows, i, o, r = case.rows, case.dims["in"], case.dims["out"], case.dims["r"]
    x, w, bias = rnd(rows, i, grad=True), rnd(o, i, scale=i ** -0.5), rnd(o, scale=0.1)
    a, b = rnd(r, i, scale=i ** -0.5, grad=True), rnd(o, r, scale=0.1, grad=True)
    twins = twin([x, a, b])

    def lora(x, a, b):
        return F.linear(x, w, bias) + 2.0 * F.linear(F.linear(x, a), b)
    return BwdInputs(lambda: fastenc.ops.lora_linear(x, w, bias, a, b, 2.0), lora, tuple(twins), [x, a, b], twins,
                     [rnd(rows, o)], flops=4.0 * rows * i * o + 6.0 * rows * r * (i + o))


def backward_select(bench: BwdInputs) -> dict:
    """The inputs automatic backend selection is asked with (as the op asks)."""
    return {"x": bench.leaves[0], "lora_a": bench.leaves[1]}
