"""This machine's own ceilings, measured in the same run as the kernels they bound (roofline denominators).

copy bandwidth: a large device-to-same-device tensor copy, bytes moved = read + write = 2 * size.
GEMM rate:      a large square matmul in the benchmark dtype, FLOPs = 2 * n^3.
Both are achievable rates (what PyTorch's own best kernels reach here), not datasheet peaks.
"""
from __future__ import annotations

import torch

from fastenc.benchmark import timing


def copy_bandwidth(device: str = "cpu", quick: bool = False) -> dict:
    """GB/s of `dst.copy_(src)` on a buffer far larger than the last-level cache (256 MiB; 1 GiB on CUDA).

    Kernels whose working set stays in cache can exceed this DRAM ceiling (fraction > 1)."""
    mib = 256
    if torch.device(device).type == "cuda":
        mib = 1024
    n = mib * 2**20 // 4
    src = torch.rand(n, device=device)
    dst = torch.empty_like(src)
    st = timing.time_fn(lambda: dst.copy_(src), device, warmup=2, repeats=5 if quick else 10, min_time_s=0.2,
                        max_repeats=50)
    gbs = 2 * n * 4 / (st.median_ms / 1e3) / 1e9
    return {"name": "copy_bandwidth", "unit": "GB/s", "value": gbs, "bytes": 2 * n * 4, "median_ms": st.median_ms,
            "how": f"dst.copy_(src), {mib} MiB fp32, bytes = read + write"}


def gemm_rate(device: str = "cpu", dtype: torch.dtype = torch.float32, quick: bool = False) -> dict:
    """TFLOP/s of an n x n x n matmul (n = 2048 on CPU, 1024 quick; 8192 on CUDA) in `dtype`."""
    on_gpu = torch.device(device).type == "cuda"
    n = 8192 if on_gpu else (1024 if quick else 2048)
    if not on_gpu and dtype not in (torch.float32, torch.bfloat16):
        dtype = torch.float32  # fp16 CPU GEMM is not a meaningful ceiling for fp32-math CPU kernels
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    c = torch.empty(n, n, device=device, dtype=dtype)
    st = timing.time_fn(lambda: torch.matmul(a, b, out=c), device, warmup=1, repeats=3 if quick else 5,
                        min_time_s=0.5, max_repeats=30)
    tflops = 2 * n ** 3 / (st.median_ms / 1e3) / 1e12
    return {"name": "gemm_rate", "unit": "TFLOP/s", "value": tflops, "flops": 2 * n ** 3, "median_ms": st.median_ms,
            "how": f"torch.matmul {n}x{n}x{n} {str(dtype).replace('torch.', '')}, FLOPs = 2 n^3"}


def measure(device: str = "cpu", dtype: torch.dtype = torch.float32, quick: bool = False) -> dict:
    """{'copy_bandwidth': {...GB/s}, 'gemm_rate': {...TFLOP/s}} for this machine, now."""
    return {"copy_bandwidth": copy_bandwidth(device, quick), "gemm_rate": gemm_rate(device, dtype, quick)}
