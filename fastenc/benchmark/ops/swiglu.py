"""swiglu benchmark spec: a LLaMA-style gated MLP's activation silu(gate) * up at 2 x 2048 -> 2048 (8 x 128 tokens),
from the fused [gate | up] GEMM output and from two separate projections; bytes = 2n in, n out;
fwd + bwd: read 2n, write n; read dy (n), x (2n), write 2n. liger-kernel's SiLU-mul on a GPU."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import fastenc
from fastenc import reference
from fastenc.benchmark.ops._common import (BERT, MEMORY, BwdCase, BwdInputs, Case, OpInputs, backward_hidden,
                                           backward_rows, grad_inputs, rand)

OP, ORDER, BOUND = "swiglu", 45, MEMORY
CUDA_PEERS = ("liger",)


def cases() -> list[Case]:
    return [Case(OP, "gated-mlp 8x128 2x2048", "LLaMA-style MLP", BERT, {"n": 2048, "two": False}, quick=True),
            Case(OP, "gated-mlp 8x128 gate,up 2048", "LLaMA-style MLP", BERT, {"n": 2048, "two": True})]


def work(case: Case, e: int) -> tuple[int, int]:
    n, T = case.dims["n"], case.tokens
    return 3 * T * n * e, 6 * T * n  # silu: exp, add, divide, multiply; times up


def eager_swiglu(x, up=None):
    gate, u = x.chunk(2, dim=-1) if up is None else (x, up)
    return F.silu(gate) * u


def _liger(gate, up):
    """liger-kernel's silu(a) * b over two contiguous (rows, n) inputs (the fused case's halves copied before timing:
    the same bytes moved as fastenc's read of the strided halves)."""
    def make():
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction
        a, b = gate.contiguous(), up.contiguous()
        return lambda: LigerSiLUMulFunction.apply(a, b)
    return make


def setup(case: Case, dev, dtype, g, seed: int) -> OpInputs:
    n, T = case.dims["n"], case.tokens
    if case.dims["two"]:
        gate, up = rand(T, n, device=dev, dtype=dtype, gen=g), rand(T, n, device=dev, dtype=dtype, gen=g)
        return OpInputs(lambda be: (lambda: fastenc.ops.swiglu(gate, up, backend=be)), {"x": gate, "up": up},
                        {"torch-eager": lambda: eager_swiglu(gate, up)}, (reference.swiglu_ref, gate, up),
                        liger=_liger(gate, up))
    x = rand(T, 2 * n, device=dev, dtype=dtype, gen=g)
    return OpInputs(lambda be: (lambda: fastenc.ops.swiglu(x, backend=be)), {"x": x, "up": None},
                    {"torch-eager": lambda: eager_swiglu(x)}, (reference.swiglu_ref, x), liger=_liger(x[:, :n], x[:, n:]))


def backward_case(quick: bool) -> BwdCase:
    rows, h = backward_rows(quick), backward_hidden(quick)
    return BwdCase(OP, f"{rows} x 2x{8 * h // 3}", rows, {"n": 8 * h // 3})


def backward_setup(case: BwdCase, device: str, dtype) -> BwdInputs:
    rnd, twin = grad_inputs(device, dtype)
    e, rows, n = torch.tensor([], dtype=dtype).element_size(), case.rows, case.dims["n"]
    x = rnd(rows, 2 * n, grad=True)
    twins = twin([x])
    return BwdInputs(lambda: fastenc.ops.swiglu(x), eager_swiglu, tuple(twins), [x], twins, [rnd(rows, n)],
                     nbytes=8 * rows * n * e)
