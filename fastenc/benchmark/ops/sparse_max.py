"""sparse_max benchmark spec: SPLADE weights of a BERT-base MLM head (hidden 768, vocabulary 30522) at 8 x 128
tokens against torch's materialized logits (addmm, then log1p(relu(.)) and the max over each sequence);
bytes = x, the decoder weight and bias in, (batch, vocab) fp32 out; flops = the vocabulary projection."""
from __future__ import annotations

import torch

import fastenc
from fastenc import reference
from fastenc.benchmark.ops._common import COMPUTE, HIDDEN, Case, OpInputs, batch, cu_seqlens, rand

OP, ORDER, BOUND = "sparse_max", 95, COMPUTE
VOCAB = 30522


def cases() -> list[Case]:
    return [Case(OP, "bert-base mlm 8x128 v30522", "BERT-base MLM (SPLADE)", batch(8, 128),
                 {"hidden": HIDDEN, "vocab": VOCAB}, quick=True),
            Case(OP, "bert-base mlm 1x32 v30522", "BERT-base MLM (SPLADE)", batch(1, 32),
                 {"hidden": HIDDEN, "vocab": VOCAB})]


def work(case: Case, e: int) -> tuple[int, int]:
    h, v, t = case.dims["hidden"], case.dims["vocab"], sum(case.lengths)
    return (t * h + v * h + v) * e + len(case.lengths) * v * 4, 2 * t * h * v


def setup(case: Case, dev, dtype, g, seed: int) -> OpInputs:
    h, v, lens = case.dims["hidden"], case.dims["vocab"], case.lengths
    x = rand(sum(lens), h, device=dev, dtype=dtype, gen=g)
    w = rand(v, h, device=dev, dtype=dtype, gen=g, scale=h ** -0.5)
    b = rand(v, device=dev, dtype=dtype, gen=g, scale=0.1)
    cu = cu_seqlens(lens, dev)

    def materialized():  # every sequence of the case has the same length
        logits = torch.addmm(b, x, w.t()).float()
        return torch.log1p(torch.relu(logits)).view(len(lens), lens[0], v).amax(1)

    return OpInputs(lambda be: (lambda: fastenc.ops.sparse_max(x, cu, w, b, backend=be)),
                    {"x": x, "cu_seqlens": cu, "weight": w, "bias": b}, {"torch-eager": materialized},
                    (reference.sparse_max_ref, x, cu, w, b))
