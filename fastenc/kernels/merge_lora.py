"""Triton LoRA merge (Hu et al. 2021): W' = W + scale * B @ A, fp32 accumulation, rounded once to W's dtype.

One program per (BLOCK_N x BLOCK_K) tile of W. The rank dimension is small (1..64 typically), so the tile's
delta is one or a few fp32 tl.dot calls over BLOCK_R-wide rank chunks (<= 32: keeps the fp32 FMA dot free of
spills); the op is bound by reading and writing W once.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from fastenc.kernels._util import on_device


@triton.jit
def _merge_lora_kernel(W, A, B, Out, N, K, R, scale,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr):
    # W, Out: (N, K); A: (R, K); B: (N, R); all contiguous.
    #   delta[n, k] = sum_r B[n, r] * A[r, k]   -- operands upcast to fp32, so every product is exact for
    #                                              fp16/bf16 adapters; fp32 accumulation (ieee, never tf32)
    #   Out[n, k]   = dtype(W[n, k] + scale * delta[n, k])   -- the single rounding
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    rn64 = rn.to(tl.int64)
    delta = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for r0 in range(0, R, BLOCK_R):
        rr = r0 + tl.arange(0, BLOCK_R)
        b = tl.load(B + rn64[:, None] * R + rr[None, :], mask=(rn[:, None] < N) & (rr[None, :] < R), other=0.0)
        a = tl.load(A + rr[:, None].to(tl.int64) * K + rk[None, :], mask=(rr[:, None] < R) & (rk[None, :] < K),
                    other=0.0)
        delta = tl.dot(b.to(tl.float32), a.to(tl.float32), delta, input_precision="ieee")
    mask = (rn[:, None] < N) & (rk[None, :] < K)
    offs = rn64[:, None] * K + rk[None, :]
    w = tl.load(W + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(Out + offs, (w + scale * delta).to(Out.dtype.element_ty), mask=mask)


def _block_r(r: int) -> int:
    return min(32, max(16, triton.next_power_of_2(r)))


def merge_lora_fwd(weight: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scale: float) -> torch.Tensor:
    """weight: (N, K); lora_a: (R, K); lora_b: (N, R); contiguous, any float dtypes, one device.
    Returns a new (N, K) tensor in weight's dtype."""
    n, k = weight.shape
    r = lora_a.shape[0]
    out = torch.empty_like(weight)
    block_n, block_k = 64, 64 if weight.is_cuda else 128
    grid = (triton.cdiv(n, block_n), triton.cdiv(k, block_k))
    with on_device(weight):
        _merge_lora_kernel[grid](weight, lora_a, lora_b, out, n, k, r, float(scale),
                                 BLOCK_N=block_n, BLOCK_K=block_k, BLOCK_R=_block_r(r), num_warps=8)
    return out


_TY = {torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.float32: "*fp32"}


def compile_specs() -> list[dict]:
    """Ahead-of-time compile configurations (see fastenc/kernels/_compile.py): the GPU launch config for the weight /
    adapter dtype pairs met in practice (adapters stored in the weight's dtype or in fp32)."""
    specs = []
    for wdt, adt in ((torch.float16, torch.float16), (torch.bfloat16, torch.bfloat16),
                     (torch.bfloat16, torch.float32), (torch.float32, torch.float32)):
        specs.append({
            "name": f"merge_lora_w{_TY[wdt][1:]}_a{_TY[adt][1:]}",
            "fn": _merge_lora_kernel,
            "signature": {"W": _TY[wdt], "A": _TY[adt], "B": _TY[adt], "Out": _TY[wdt], "N": "i32", "K": "i32",
                          "R": "i32", "scale": "fp32", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr",
                          "BLOCK_R": "constexpr"},
            "constexprs": {"BLOCK_N": 64, "BLOCK_K": 64, "BLOCK_R": 32},
            "num_warps": 8,
            "num_stages": 1,
        })
    return specs
