"""dropout benchmark spec: BERT-base's hidden dropout with its bias (p 0.1, hidden 768). Every fastenc call draws
(seed, offset) from a generator seeded alike, so each backend makes the reference's keep-mask (torch's F.dropout
draws its own: the same cost, another mask). bytes = x in, y out, the bias; the mask's hash is not counted."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import fastenc
from fastenc import reference
from fastenc.benchmark.ops._common import BERT, HIDDEN, MEMORY, Case, OpInputs, rand
from fastenc.ops._common import draw_seed_offset

OP, ORDER, BOUND = "dropout", 50, MEMORY
NOT_COMPILED = ("torch.compile of the reference (its keep-mask's integer hash chain) did not finish compiling in "
                "5 minutes on the CPU")


def cases() -> list[Case]:
    return [Case(OP, "bert-base 8x128 h768 p0.1 +bias", "BERT-base", BERT, {"n": HIDDEN, "p": 0.1, "bias": True},
                 quick=True)]


def work(case: Case, e: int) -> tuple[int, int]:
    n, T = case.dims["n"], case.tokens  # (x + bias) * keep * scale
    return (2 * T * n + (n if case.dims.get("bias") else 0)) * e, 2 * T * n


def _reference(x, p, mask_seed, mask_offset, b, upcast=True):  # the reference computes in fp32 either way
    return reference.dropout_ref(x, p, mask_seed, mask_offset, b)


def setup(case: Case, dev, dtype, g, seed: int) -> OpInputs:
    n, p = case.dims["n"], case.dims["p"]
    x = rand(case.tokens, n, device=dev, dtype=dtype, gen=g)
    b = rand(n, device=dev, dtype=dtype, gen=g) if case.dims["bias"] else None
    mask_seed, mask_offset = draw_seed_offset(torch.Generator().manual_seed(seed))
    eager = (lambda: F.dropout(x + b, p)) if b is not None else (lambda: F.dropout(x, p))
    return OpInputs(lambda be: (lambda: fastenc.ops.dropout(x, p, bias=b, backend=be,
                                                            generator=torch.Generator().manual_seed(seed))),
                    {"x": x, "bias": b}, {"torch-eager": eager}, (_reference, x, p, mask_seed, mask_offset, b))
