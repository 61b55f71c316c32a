"""merge_lora benchmark spec: W + s B A for BERT-base's fused QKV weight (2304 x 768, r 16) against torch.addmm;
bytes = W in and out plus A and B; flops = the rank-r product and the add."""
from __future__ import annotations

import torch

import fastenc
from fastenc import reference
from fastenc.benchmark.ops._common import HIDDEN, MEMORY, Case, OpInputs, rand

OP, ORDER, BOUND = "merge_lora", 80, MEMORY


def cases() -> list[Case]:
    return [Case(OP, "bert-base qkv 2304x768 r16", "BERT-base + LoRA", [1], {"out": 3 * HIDDEN, "in": HIDDEN, "r": 16},
                 quick=True)]


def work(case: Case, e: int) -> tuple[int, int]:
    o, i, r = case.dims["out"], case.dims["in"], case.dims["r"]
    return (2 * o * i + r * (o + i)) * e, 2 * o * i * r + o * i


def setup(case: Case, dev, dtype, g, seed: int) -> OpInputs:
    o, i, r = case.dims["out"], case.dims["in"], case.dims["r"]
    w = rand(o, i, device=dev, dtype=dtype, gen=g)
    a, bb = rand(r, i, device=dev, dtype=dtype, gen=g), rand(o, r, device=dev, dtype=dtype, gen=g)
    return OpInputs(lambda be: (lambda: fastenc.ops.merge_lora(w, a, bb, 2.0, backend=be)),
                    {"weight": w, "lora_a": a, "lora_b": bb}, {"torch-eager": lambda: torch.addmm(w, bb, a, alpha=2.0)},
                    (reference.merge_lora_ref, w, a, bb, 2.0))
