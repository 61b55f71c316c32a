"""Triton LayerNorm / RMSNorm backward from the forward's per-row mean and rstd (one kernel for both norms).

Algorithm (as in Apex's and Triton tutorial 05's fused LayerNorm backward): a program owns a contiguous block of
rows, computes dx row by row with the whole row in registers, and accumulates its rows' dweight/dbias in fp32
registers; it writes one partial row per program, and a second pass sums the partial rows (few programs: a
(programs, hidden) fp32 buffer, a fraction of dy's size).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from fastenc.kernels._util import on_device

MAX_HIDDEN = 8192  # the row and the partial accumulators live in registers


@triton.jit
def _norm_bwd_kernel(DY, DH, H, W, Mean, Rstd, DX, DWp, DBp, M, N, rows_per_prog,
                     HAS_DH: tl.constexpr, IS_RMS: tl.constexpr, HAS_DW: tl.constexpr, HAS_DB: tl.constexpr,
                     BLOCK_N: tl.constexpr):
    # Per row (N = hidden), from the saved mean (LayerNorm; 0 for RMSNorm) and rstd:
    #   xhat = (h - mean) * rstd,  g = w * dy
    #   LayerNorm: dx = rstd * (g - sum(g)/N - xhat * sum(g * xhat)/N)
    #   RMSNorm:   dx = rstd * (g - xhat * sum(g * xhat)/N)
    #   dx += dh (the gradient arriving on the stored residual stream h = x + residual)
    #   dweight_partial += dy * xhat,  dbias_partial += dy   (fp32, this program's rows)
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    db = tl.zeros([BLOCK_N], dtype=tl.float32)
    start = pid.to(tl.int64) * rows_per_prog
    end = tl.minimum(start + rows_per_prog, M)
    for row in range(start, end):
        off = row * N + cols
        dy = tl.load(DY + off, mask=mask, other=0.0).to(tl.float32)
        h = tl.load(H + off, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(Rstd + row)
        if IS_RMS:
            xhat = h * rstd
        else:
            xhat = (h - tl.load(Mean + row)) * rstd
        xhat = tl.where(mask, xhat, 0.0)
        g = dy * w
        c_gx = tl.sum(g * xhat, axis=0) / N
        if IS_RMS:
            dx = (g - xhat * c_gx) * rstd
        else:
            dx = (g - tl.sum(g, axis=0) / N - xhat * c_gx) * rstd
        if HAS_DH:
            dx += tl.load(DH + off, mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + off, dx.to(DX.dtype.element_ty), mask=mask)
        if HAS_DW:
            dw += dy * xhat
        if HAS_DB:
            db += dy
    if HAS_DW:
        tl.store(DWp + pid * N + cols, dw, mask=mask)
    if HAS_DB:
        tl.store(DBp + pid * N + cols, db, mask=mask)


@dataclass(frozen=True)
class NormBwdConfig:
    """Launch configuration of the backward kernel: block over the row, warps, programs (partial rows)."""
    block_n: int
    num_warps: int
    programs: int
    rows_per_prog: int


def norm_bwd_config(rows: int, hidden: int, device: torch.device) -> NormBwdConfig:
    """Analytical default: the row in one block (<= 16 fp32 values per thread per tensor), and about four
    programs per SM (the partial rows stay few); under the interpreter a handful of programs."""
    block = triton.next_power_of_2(max(hidden, 1))
    warps = max(1, min(16, block // 512))
    if device.type == "cuda":
        slots = 4 * torch.cuda.get_device_properties(device).multi_processor_count
    else:
        slots = 4
    rpp = triton.cdiv(rows, max(1, min(rows, slots)))
    return NormBwdConfig(block, warps, triton.cdiv(rows, rpp), rpp)


def norm_bwd(dy: torch.Tensor, dh: torch.Tensor | None, h: torch.Tensor, weight: torch.Tensor,
             mean: torch.Tensor | None, rstd: torch.Tensor, need_weight: bool, need_bias: bool, *,
             dx_out: torch.Tensor | None = None):
    """dy, dh (or None), h: (rows, hidden) contiguous fp32/fp16/bf16; weight: (hidden,) in h's dtype; mean (None for
    RMSNorm), rstd: (rows,) fp32. Returns (dx like h, dweight or None, dbias or None), weight's dtype; dx is written
    into `dx_out` when given (h's shape and dtype, contiguous)."""
    m, n = h.shape
    if n > MAX_HIDDEN:
        raise ValueError(f"norm_bwd (triton): hidden must be <= {MAX_HIDDEN}, got {n}")
    dy, h, weight, rstd = dy.contiguous(), h.contiguous(), weight.contiguous(), rstd.contiguous()
    dh = None if dh is None else dh.contiguous()
    dx = torch.empty_like(h) if dx_out is None else dx_out
    cfg = norm_bwd_config(m, n, h.device)
    dwp = torch.empty((cfg.programs, n), dtype=torch.float32, device=h.device) if need_weight else None
    dbp = torch.empty((cfg.programs, n), dtype=torch.float32, device=h.device) if need_bias else None
    with on_device(h):
        _norm_bwd_kernel[(cfg.programs,)](
            dy, dh if dh is not None else dy, h, weight, mean if mean is not None else rstd, rstd, dx,
            dwp if dwp is not None else rstd, dbp if dbp is not None else rstd, m, n, cfg.rows_per_prog,
            HAS_DH=dh is not None, IS_RMS=mean is None, HAS_DW=need_weight, HAS_DB=need_bias,
            BLOCK_N=cfg.block_n, num_warps=cfg.num_warps)
    # second pass: the partial rows summed (fp32), rounded once to weight's dtype
    dw = dwp.sum(0).to(weight.dtype) if need_weight else None
    db = dbp.sum(0).to(weight.dtype) if need_bias else None
    return dx, dw, db


def _spec(name: str, dt: str, hidden: int, dh: bool, rms: bool, dw: bool, db: bool) -> dict:
    block = triton.next_power_of_2(hidden)
    p = "*" + dt
    return {
        "name": name, "fn": _norm_bwd_kernel,
        "signature": {"DY": p, "DH": p, "H": p, "W": p, "Mean": "*fp32", "Rstd": "*fp32", "DX": p, "DWp": "*fp32",
                      "DBp": "*fp32", "M": "i32", "N": "i32", "rows_per_prog": "i32", "HAS_DH": "constexpr",
                      "IS_RMS": "constexpr", "HAS_DW": "constexpr", "HAS_DB": "constexpr", "BLOCK_N": "constexpr"},
        "constexprs": {"HAS_DH": dh, "IS_RMS": rms, "HAS_DW": dw, "HAS_DB": db, "BLOCK_N": block},
        "divisible_by_16": ["N"] if hidden % 16 == 0 else [],
        "num_warps": max(1, min(16, block // 512)), "num_stages": 1,
    }


def compile_specs() -> list[dict]:
    """Representative backward configurations for the compile-for-sm_80/sm_90 check (see _compile.py)."""
    return [
        _spec("ln_bwd_bf16_768_dh", "bf16", 768, True, False, True, True),
        _spec("ln_bwd_fp16_1000", "fp16", 1000, False, False, True, True),
        _spec("ln_bwd_fp32_1152_dh", "fp32", 1152, True, False, True, True),
        _spec("ln_bwd_bf16_8192", "bf16", 8192, True, False, True, True),
        _spec("rms_bwd_bf16_4096_dh", "bf16", 4096, True, True, True, False),
        _spec("rms_bwd_fp32_8192", "fp32", 8192, False, True, True, False),
    ]
