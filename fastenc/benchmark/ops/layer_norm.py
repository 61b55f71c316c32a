"""layer_norm benchmark spec: BERT-base (+ residual), ModernBERT-base (no bias) and ViT-B/16 rows at hidden 768,
the long sweep; bytes = x, y (+ residual in, h out) and the parameters; liger-kernel's LayerNorm on a GPU."""
from __future__ import annotations

import torch.nn.functional as F

import fastenc
from fastenc import reference
from fastenc.benchmark.ops._common import (BERT, HIDDEN, MEMORY, VIT, BwdCase, Case, backward_hidden,
                                           backward_rows, rand)
from fastenc.benchmark.ops import _norm

OP, ORDER, BOUND = "layer_norm", 10, MEMORY
CUDA_PEERS = ("liger",)


def cases() -> list[Case]:
    return [Case(OP, "bert-base 8x128 h768 +res", "BERT-base", BERT, {"hidden": HIDDEN, "bias": True, "residual": True},
                 quick=True),
            Case(OP, "modernbert-base 8x128 h768 nobias", "ModernBERT-base", BERT,
                 {"hidden": HIDDEN, "bias": False, "residual": False}),
            Case(OP, "vit-b16 8x197 h768", "ViT-B/16", VIT, {"hidden": HIDDEN, "bias": True, "residual": False})]


def sweep(seq: int) -> list[Case]:
    return [Case(OP, f"long 1x{seq} h768", "sweep", [seq], {"hidden": HIDDEN, "bias": True, "residual": False})]


work = _norm.work


def setup(case: Case, dev, dtype, g, seed: int):
    h, d, T = case.dims["hidden"], case.dims, case.tokens
    x, w = rand(T, h, device=dev, dtype=dtype, gen=g), rand(h, device=dev, dtype=dtype, gen=g)
    b = rand(h, device=dev, dtype=dtype, gen=g) if d["bias"] else None
    r = rand(T, h, device=dev, dtype=dtype, gen=g) if d["residual"] else None
    if r is None:
        eager = lambda: F.layer_norm(x, (h,), w, b, 1e-5)  # noqa: E731
    else:
        eager = lambda: (F.layer_norm(x + r, (h,), w, b, 1e-5))  # noqa: E731

    def liger():
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
        bb = b if b is not None else w.new_zeros(w.shape)
        return lambda: LigerLayerNormFunction.apply(x, w, bb, 1e-5)
    return _norm.inputs(lambda be: (lambda: fastenc.ops.layer_norm(x, w, b, 1e-5, residual=r, backend=be)),
                        {"x": x, "weight": w, "bias": b, "residual": r}, eager,
                        (reference.layer_norm_ref, x, w, b, 1e-5, r), None if r is not None else liger)


def backward_case(quick: bool) -> BwdCase:
    rows, h = backward_rows(quick), backward_hidden(quick)
    return BwdCase(OP, f"{rows} x h{h} +res", rows, {"n": h})


def backward_setup(case: BwdCase, device: str, dtype):
    n = case.dims["n"]
    return _norm.backward(case, device, dtype, with_bias=True,
                          ours=lambda x, r, w, b: fastenc.ops.layer_norm(x, w, b, residual=r),
                          eager=lambda x, r, w, b: (F.layer_norm(x + r, (n,), w, b, 1e-5), x + r))
