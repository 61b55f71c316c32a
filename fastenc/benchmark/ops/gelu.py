"""gelu benchmark spec: the MLP's exact GELU with its bias at BERT-base and ViT-B/16 (n 3072) and the long sweep;
bytes = x in, y out and the bias; fwd + bwd: read x, write y; read dy, x, write dx."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import fastenc
from fastenc import reference
from fastenc.benchmark.ops._common import (BERT, MEMORY, VIT, BwdCase, BwdInputs, Case, OpInputs, backward_hidden,
                                           backward_rows, grad_inputs, rand)

OP, ORDER, BOUND = "gelu", 30, MEMORY


def cases() -> list[Case]:
    return [Case(OP, "bert-base 8x128 n3072 +bias", "BERT-base", BERT, {"n": 3072, "bias": True}, quick=True),
            Case(OP, "vit-b16 8x197 n3072 +bias", "ViT-B/16", VIT, {"n": 3072, "bias": True})]


def sweep(seq: int) -> list[Case]:
    return [Case(OP, f"long 1x{seq} n3072", "sweep", [seq], {"n": 3072, "bias": True})]


def work(case: Case, e: int) -> tuple[int, int]:
    n, T = case.dims["n"], case.tokens
    return (2 * T * n + (n if case.dims.get("bias") else 0)) * e, 10 * T * n


def setup(case: Case, dev, dtype, g, seed: int) -> OpInputs:
    n = case.dims["n"]
    x = rand(case.tokens, n, device=dev, dtype=dtype, gen=g)
    b = rand(n, device=dev, dtype=dtype, gen=g) if case.dims["bias"] else None
    eager = (lambda: F.gelu(x + b)) if b is not None else (lambda: F.gelu(x))
    return OpInputs(lambda be: (lambda: fastenc.ops.gelu(x, b, backend=be)), {"x": x, "bias": b},
                    {"torch-eager": eager}, (reference.gelu_ref, x, b))


def backward_case(quick: bool) -> BwdCase:
    rows, h = backward_rows(quick), backward_hidden(quick)
    return BwdCase(OP, f"{rows} x n{4 * h} +bias", rows, {"n": 4 * h})


def backward_setup(case: BwdCase, device: str, dtype) -> BwdInputs:
    rnd, twin = grad_inputs(device, dtype)
    e, rows, n = torch.tensor([], dtype=dtype).element_size(), case.rows, case.dims["n"]
    x, b = rnd(rows, n, grad=True), rnd(n, scale=0.1, grad=True)
    twins = twin([x, b])
    return BwdInputs(lambda: fastenc.ops.gelu(x, b), lambda x, b: F.gelu(x + b), tuple(twins), [x, b], twins,
                     [rnd(rows, n)], nbytes=5 * rows * n * e)
