"""geglu benchmark spec: ModernBERT-base's gated MLP activation (2 x 1152 -> 1152); bytes = 2n in, n out;
fwd + bwd: read 2n, write n; read dy (n), x (2n), write 2n. liger-kernel's GeGLU is tanh-only: no peer."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import fastenc
from fastenc import reference
from fastenc.benchmark.ops._common import (BERT, MEMORY, BwdCase, BwdInputs, Case, OpInputs, backward_hidden,
                                           backward_rows, grad_inputs, rand)

OP, ORDER, BOUND = "geglu", 40, MEMORY


def cases() -> list[Case]:
    return [Case(OP, "modernbert-base 8x128 2x1152", "ModernBERT-base", BERT, {"n": 1152}, quick=True)]


def work(case: Case, e: int) -> tuple[int, int]:
    n, T = case.dims["n"], case.tokens
    return 3 * T * n * e, 11 * T * n


def eager_geglu(x):
    a, gate = x.chunk(2, dim=-1)
    return F.gelu(a) * gate


def setup(case: Case, dev, dtype, g, seed: int) -> OpInputs:
    x = rand(case.tokens, 2 * case.dims["n"], device=dev, dtype=dtype, gen=g)
    return OpInputs(lambda be: (lambda: fastenc.ops.geglu(x, backend=be)), {"x": x},
                    {"torch-eager": lambda: eager_geglu(x)}, (reference.geglu_ref, x))


def backward_case(quick: bool) -> BwdCase:
    rows, h = backward_rows(quick), backward_hidden(quick)
    return BwdCase(OP, f"{rows} x 2x{3 * h // 2}", rows, {"n": 3 * h // 2})


def backward_setup(case: BwdCase, device: str, dtype) -> BwdInputs:
    rnd, twin = grad_inputs(device, dtype)
    e, rows, n = torch.tensor([], dtype=dtype).element_size(), case.rows, case.dims["n"]
    x = rnd(rows, 2 * n, grad=True)
    twins = twin([x])
    return BwdInputs(lambda: fastenc.ops.geglu(x), eager_geglu, tuple(twins), [x], twins, [rnd(rows, n)],
                     nbytes=8 * rows * n * e)
