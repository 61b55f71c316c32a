"""rms_norm benchmark spec: BERT-base dimensions (hidden 768) with and without the residual; bytes = x, y
(+ residual in, h out) and the weight; liger-kernel's RMSNorm on a GPU."""
from __future__ import annotations

import torch.nn.functional as F

import fastenc
from fastenc import reference
from fastenc.benchmark.ops._common import BERT, HIDDEN, MEMORY, BwdCase, Case, backward_hidden, backward_rows, rand
from fastenc.benchmark.ops import _norm

OP, ORDER, BOUND = "rms_norm", 20, MEMORY
CUDA_PEERS = ("liger",)


def cases() -> list[Case]:
    return [Case(OP, "bert-base 8x128 h768", "BERT-base dims", BERT, {"hidden": HIDDEN, "residual": False}, quick=True),
            Case(OP, "bert-base 8x128 h768 +res", "BERT-base dims", BERT, {"hidden": HIDDEN, "residual": True})]


work = _norm.work


def setup(case: Case, dev, dtype, g, seed: int):
    h, T = case.dims["hidden"], case.tokens
    x, w = rand(T, h, device=dev, dtype=dtype, gen=g), rand(h, device=dev, dtype=dtype, gen=g)
    r = rand(T, h, device=dev, dtype=dtype, gen=g) if case.dims["residual"] else None
    if r is None:
        eager = lambda: F.rms_norm(x, (h,), w, 1e-6)  # noqa: E731
    else:
        eager = lambda: F.rms_norm(x + r, (h,), w, 1e-6)  # noqa: E731

    def liger():
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        return lambda: LigerRMSNormFunction.apply(x, w, 1e-6)
    return _norm.inputs(lambda be: (lambda: fastenc.ops.rms_norm(x, w, 1e-6, residual=r, backend=be)),
                        {"x": x, "weight": w, "residual": r}, eager, (reference.rms_norm_ref, x, w, 1e-6, r),
                        None if r is not None else liger)


def backward_case(quick: bool) -> BwdCase:
    rows, h = backward_rows(quick), backward_hidden(quick)
    return BwdCase(OP, f"{rows} x h{h} +res", rows, {"n": h})


def backward_setup(case: BwdCase, device: str, dtype):
    n = case.dims["n"]
    return _norm.backward(case, device, dtype, with_bias=False,
                          ours=lambda x, r, w: fastenc.ops.rms_norm(x, w, residual=r),
                          eager=lambda x, r, w: (F.rms_norm(x + r, (n,), w, 1e-6), x + r))
