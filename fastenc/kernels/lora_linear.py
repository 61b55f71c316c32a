"""Triton fused unmerged LoRA linear (Hu et al. 2021): y = x W^T + b + scale * (x A^T) B^T in one kernel.

Tiled like the Triton matmul tutorial over (BLOCK_M tokens, BLOCK_N out features) with grouped program
ordering for L2 reuse. In the K loop each x tile is loaded once and feeds two dots: the base accumulator
and the rank-r intermediate xa = x A^T, which stays in registers (r padded to BLOCK_R >= 16). After the
loop one more dot folds the low-rank update into the accumulator. The intermediate never touches memory.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from fastenc.kernels._util import on_device

MAX_RANK = 128
MAX_RANK_FP32 = 64  # the fp32 (ieee, FMA) dots spill registers beyond this


@triton.jit
def _lora_linear_kernel(X, W, Bias, A, B, Y, M, N, K, R, scale,
                        HAS_BIAS: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr,
                        GROUP_M: tl.constexpr):
    # X: (M, K); W: (N, K); Bias: (N,); A: (R, K); B: (N, R); Y: (M, N); all contiguous, R <= BLOCK_R.
    #   acc = sum_k X[m, k] W[n, k]          (fp32 accumulation)
    #   xa  = sum_k X[m, k] A[r, k]          (same x tile, fp32, on chip)
    #   acc += dtype(scale * xa) @ B[n, :]^T (xa rounded to the input dtype for the tensor-core dot, as a
    #                                         low-precision PEFT forward rounds its lora_A output)
    #   Y   = dtype(acc + Bias[n])
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_n
    first_m = (pid // group) * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % size_m
    pid_n = (pid % group) // size_m

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rr = tl.arange(0, BLOCK_R)
    rm64 = rm.to(tl.int64)
    rn64 = rn.to(tl.int64)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    xa = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        kmask = rk < K
        x = tl.load(X + rm64[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & kmask[None, :], other=0.0)
        w = tl.load(W + rn64[None, :] * K + rk[:, None], mask=(rn[None, :] < N) & kmask[:, None], other=0.0)
        a = tl.load(A + rr[None, :] * K + rk[:, None], mask=(rr[None, :] < R) & kmask[:, None], other=0.0)
        if IEEE:
            acc = tl.dot(x, w, acc, input_precision="ieee")
            xa = tl.dot(x, a, xa, input_precision="ieee")
        else:
            acc = tl.dot(x, w, acc)
            xa = tl.dot(x, a, xa)
    b = tl.load(B + rn64[None, :] * R + rr[:, None], mask=(rn[None, :] < N) & (rr[:, None] < R), other=0.0)
    xs = (xa * scale).to(X.dtype.element_ty)
    if IEEE:
        acc = tl.dot(xs, b, acc, input_precision="ieee")
    else:
        acc = tl.dot(xs, b, acc)
    if HAS_BIAS:
        acc += tl.load(Bias + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    ymask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(Y + rm64[:, None] * N + rn[None, :], acc.to(Y.dtype.element_ty), mask=ymask)


def _block_r(r: int) -> int:
    return max(16, triton.next_power_of_2(r))


def _config(on_gpu: bool, dtype: torch.dtype, r: int) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)."""
    if not on_gpu:  # interpreter: few, large tile steps
        return 64, 64, 128, 4, 1
    if dtype == torch.float32:  # ieee fp32 dot runs on FMA units: small K steps keep it in registers
        return 64, 64, 16, 8, 3
    if r > 32:  # the (BLOCK_M, BLOCK_R) intermediate needs registers too: halve BLOCK_M (no spills on sm_80)
        return 64, 128, 64, 8, 3
    return 128, 128, 64, 8, 3


def lora_linear_fwd(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, lora_a: torch.Tensor,
                    lora_b: torch.Tensor, scale: float) -> torch.Tensor:
    """x: (M, K); weight: (N, K); bias: (N,) or None; lora_a: (R, K); lora_b: (N, R); contiguous, one dtype,
    R <= MAX_RANK (MAX_RANK_FP32 for fp32). Returns (M, N) in x's dtype."""
    m, k = x.shape
    n = weight.shape[0]
    r = lora_a.shape[0]
    y = torch.empty((m, n), device=x.device, dtype=x.dtype)
    bm, bn, bk, warps, stages = _config(x.is_cuda, x.dtype, r)
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    with on_device(x):
        _lora_linear_kernel[grid](x, weight, bias if bias is not None else x, lora_a, lora_b, y, m, n, k, r,
                                  float(scale), HAS_BIAS=bias is not None, IEEE=x.dtype == torch.float32,
                                  BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, BLOCK_R=_block_r(r), GROUP_M=8,
                                  num_warps=warps, num_stages=stages)
    return y


_TY = {torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.float32: "*fp32"}


def compile_specs() -> list[dict]:
    """Ahead-of-time compile configurations (see fastenc/kernels/_compile.py): each GPU launch config of `_config`
    (small rank, rank > 32, the largest rank) per dtype."""
    specs = []
    for dt, ranks in ((torch.float16, (32, 128)), (torch.bfloat16, (16, 64, 128)), (torch.float32, (16, 64))):
        for block_r in ranks:
            bm, bn, bk, warps, stages = _config(True, dt, block_r)
            p = _TY[dt]
            specs.append({
                "name": f"lora_linear_{p[1:]}_r{block_r}",
                "fn": _lora_linear_kernel,
                "signature": {"X": p, "W": p, "Bias": p, "A": p, "B": p, "Y": p, "M": "i32", "N": "i32", "K": "i32",
                              "R": "i32", "scale": "fp32", "HAS_BIAS": "constexpr", "IEEE": "constexpr",
                              "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr",
                              "BLOCK_R": "constexpr", "GROUP_M": "constexpr"},
                "constexprs": {"HAS_BIAS": True, "IEEE": dt == torch.float32, "BLOCK_M": bm, "BLOCK_N": bn,
                               "BLOCK_K": bk, "BLOCK_R": block_r, "GROUP_M": 8},
                "num_warps": warps,
                "num_stages": stages,
                "divisible_by_16": ["N", "K"],
            })
    return specs
