"""What the layer_norm and rms_norm specs share: the bytes/FLOPs model, the forward inputs record and the
residual forward + backward set-up (bytes: fwd read x, r, write y, h; bwd read dy, dh, h, write dx)."""
from __future__ import annotations

import torch

from fastenc.benchmark.ops._common import BwdCase, BwdInputs, OpInputs, grad_inputs


def work(case, e: int) -> tuple[int, int]:
    """(bytes, flops): x, y (+ residual in, h out) and the parameters once; 8 flops per element."""
    h, T, d = case.dims["hidden"], case.tokens, case.dims
    n_io = 2 + (2 if d.get("residual") else 0)
    params = h * (2 if d.get("bias") else 1)
    return (n_io * T * h + params) * e, 8 * T * h


def inputs(call, sel, eager, ref, liger) -> OpInputs:
    return OpInputs(call, sel, {"torch-eager": eager}, ref, liger=liger)


def backward(case: BwdCase, device: str, dtype, *, with_bias: bool, ours, eager) -> BwdInputs:
    rnd, twin = grad_inputs(device, dtype)
    e = torch.tensor([], dtype=dtype).element_size()
    rows, n = case.rows, case.dims["n"]
    x, r, w, b = rnd(rows, n, grad=True), rnd(rows, n, grad=True), rnd(n, grad=True), rnd(n, scale=0.1, grad=True)
    grads = [rnd(rows, n), rnd(rows, n)]
    leaves = [x, r, w, b] if with_bias else [x, r, w]
    twins = twin(leaves)
    return BwdInputs(lambda: ours(*leaves), eager, tuple(twins), leaves, twins, grads, nbytes=8 * rows * n * e)
