"""Attention forward + backward (training) on the CPU: fastenc's C++ kernels against torch SDPA, and the backward's
working memory against sequence length.

Measured in one process, fastenc and SDPA interleaved (ABAB) so both see the same machine state:
  fastenc  fastenc.ops.attention(..., backend="cpu") on the packed variable-length batch, then .backward(grad)
  sdpa     torch.nn.functional.scaled_dot_product_attention on the padded batch (bool key mask), then .backward(grad)
Workload: 16 sequences, lengths uniform in [16, 384] (torch.Generator seed 0), 12 heads, head_dim 64, fp32. Speed is
useful (real) tokens per second; the ratio is SDPA time / fastenc time (> 1: fastenc faster), of medians and of
minimums, plus the ratio of one-thread CPU times (robust to other processes on the machine).
FLOPs (per head, per sequence of s tokens, head dim d): forward 4 s^2 d (Q K^T, P V), backward 10 s^2 d (the five
products S, dP, dV, dK, dQ), fwd + bwd = 3.5x the forward; the fraction of the machine's fp32 GEMM rate (torch.matmul
2048^3, measured in the same run) is the FLOP rate of the real tokens' work divided by it.
Memory: extra resident memory of one backward call (fresh process, every block >= 64 KiB mapped afresh), one
sequence, one head, seq 2048 / 4096 / 8192: it must grow linearly (8192 at most 2.2x of 4096).
Usage: python bench/attention_backward.py [--threads 2] [--repeats 7] [--quick]
Writes bench/out/attention-backward-cpu-fp32-t<threads>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import fastenc
from fastenc.benchmark import ceilings, report, timing
from fastenc.benchmark.kernels import varlen_lengths

HEADS, HEAD_DIM = 12, 64
TARGET = 2.0  # fastenc fwd+bwd speed / SDPA fwd+bwd speed, useful tokens


def _flops(lens: list[int], heads: int, d: int) -> tuple[float, float]:
    """(forward, forward + backward) FLOPs of the real tokens' attention."""
    fwd = sum(4.0 * s * s * d for s in lens) * heads
    return fwd, fwd * 3.5


def _cpu_time_ratio(ours, sdpa, repeats: int) -> float:
    """SDPA / fastenc calling-thread CPU time with one thread each, interleaved, medians."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ours(), sdpa()
        t = {"fastenc": [], "sdpa": []}
        for _ in range(max(5, repeats)):
            for name, fn in (("fastenc", ours), ("sdpa", sdpa)):
                t0 = time.thread_time()
                fn()
                t[name].append(time.thread_time() - t0)
    finally:
        torch.set_num_threads(threads)
    med = {k: sorted(v)[len(v) // 2] for k, v in t.items()}
    return med["sdpa"] / med["fastenc"]


def varlen(repeats: int, gemm_tflops: float) -> dict:
    gen = torch.Generator().manual_seed(0)
    lens = varlen_lengths()
    total, longest, b = sum(lens), max(lens), len(lens)
    q, k, v, g = (torch.randn(total, HEADS, HEAD_DIM, generator=gen) for _ in range(4))
    cu = torch.zeros(b + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lens).cumsum(0)
    mask = torch.arange(longest)[None, :] < torch.tensor(lens)[:, None]

    def pad(x):
        out = x.new_zeros(b, longest, HEADS, HEAD_DIM)
        out[mask] = x
        return out.transpose(1, 2).contiguous()  # (b, h, s, d)

    qp, kp, vp, gp = pad(q), pad(k), pad(v), pad(g)
    attn_mask = mask[:, None, None, :]
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    pleaves = [t.clone().requires_grad_(True) for t in (qp, kp, vp)]

    def ours():
        for t in leaves:
            t.grad = None
        fastenc.ops.attention(*leaves, cu_seqlens=cu, max_seqlen=longest, backend="cpu").backward(g)

    def sdpa():
        for t in pleaves:
            t.grad = None
        F.scaled_dot_product_attention(*pleaves, attn_mask=attn_mask).backward(gp)

    samples = timing.interleaved({"fastenc": ours, "sdpa": sdpa}, "cpu", warmup=1, repeats=repeats, min_time_s=1.0,
                                 max_repeats=30)
    st = {k: timing.summarize(v) for k, v in samples.items()}
    fwd_flops, total_flops = _flops(lens, HEADS, HEAD_DIM)
    row = {"case": "varlen fwd+bwd", "batch": b, "seq": longest, "lengths": lens, "useful_tokens": total,
           "padded_tokens": b * longest, "flops_fwd": fwd_flops, "flops_fwd_bwd": total_flops,
           "flops_ratio_fwd_bwd_to_fwd": total_flops / fwd_flops}
    for name, s in st.items():
        row[f"{name}_ms"] = s.median_ms
        row[f"{name}_min_ms"] = s.min_ms
        row[f"{name}_useful_tokens_per_s"] = total / (s.median_ms / 1e3)
    row["speedup_vs_sdpa"] = st["sdpa"].median_ms / st["fastenc"].median_ms
    row["speedup_vs_sdpa_min"] = st["sdpa"].min_ms / st["fastenc"].min_ms
    row["speedup_vs_sdpa_cpu_time_1thread"] = _cpu_time_ratio(ours, sdpa, repeats)
    row["fastenc_tflops"] = total_flops / (st["fastenc"].median_ms / 1e3) / 1e12
    row["gemm_tflops"] = gemm_tflops
    row["fraction_of_gemm_rate"] = row["fastenc_tflops"] / gemm_tflops
    return row


def memory(seqs: list[int]) -> list[dict]:
    """Extra resident memory of one backward call (forward already run and held), one sequence, one head."""
    gen = torch.Generator().manual_seed(0)
    rows = []
    for s in seqs:
        q, k, v, g = (torch.randn(s, 1, HEAD_DIM, generator=gen) for _ in range(4))
        cu = torch.tensor([0, s], dtype=torch.int32)
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        fastenc.ops.attention(*leaves, cu_seqlens=cu, backend="cpu").backward(g)  # warm
        for t in leaves:
            t.grad = None
        out = fastenc.ops.attention(*leaves, cu_seqlens=cu, backend="cpu")
        mib, how = timing.peak_memory(lambda: torch.autograd.grad(out, leaves, g, retain_graph=True))
        rows.append({"seq": s, "backward_extra_mib": mib, "grads_mib": 3 * q.numel() * 4 / 2**20,
                     "scores_mib": s * s * 4 / 2**20, "method": how})
        print(f"backward extra memory seq {s:5d}: {mib:7.2f} MiB (dq+dk+dv {rows[-1]['grads_mib']:.2f} MiB; one "
              f"score matrix would be {rows[-1]['scores_mib']:.0f} MiB)", flush=True)
    return rows


def memory_subprocess(seqs: list[int], threads: int) -> list[dict]:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", FASTENC_CPU_CACHE="0")
    cmd = [sys.executable, __file__, "--memory-only", ",".join(map(str, seqs)), "--threads", str(threads)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    lines = res.stdout.splitlines()
    print("\n".join(ln for ln in lines if ln.startswith("backward extra")), flush=True)
    return json.loads(next(ln for ln in lines if ln.startswith("[")))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--quick", action="store_true", help="fewer repeats, memory at 2048 / 4096 only")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "out"))
    p.add_argument("--memory-only", metavar="SEQS", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    if a.memory_only:
        print(json.dumps(memory([int(s) for s in a.memory_only.split(",")])))
        return 0
    repeats = 3 if a.quick else a.repeats
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    print(f"attention fwd+bwd on CPU, {a.threads} threads, fp32, heads {HEADS}, head_dim {HEAD_DIM}; load average "
          f"{load:.1f}")
    gemm = ceilings.gemm_rate("cpu", torch.float32, quick=a.quick)["value"]
    row = varlen(repeats, gemm)
    print(f"varlen fwd+bwd: fastenc {row['fastenc_ms']:.1f} ms, sdpa (padded) {row['sdpa_ms']:.1f} ms; useful tokens/s "
          f"ratio {row['speedup_vs_sdpa']:.2f}x (best-of {row['speedup_vs_sdpa_min']:.2f}x, 1-thread CPU time "
          f"{row['speedup_vs_sdpa_cpu_time_1thread']:.2f}x), needs >= {TARGET}x")
    print(f"FLOPs fwd {row['flops_fwd'] / 1e9:.2f} G, fwd+bwd {row['flops_fwd_bwd'] / 1e9:.2f} G "
          f"({row['flops_ratio_fwd_bwd_to_fwd']:.1f}x); fastenc {row['fastenc_tflops'] * 1e3:.1f} GFLOP/s = "
          f"{row['fraction_of_gemm_rate']:.2f} of the fp32 GEMM rate ({gemm * 1e3:.1f} GFLOP/s)")
    mem = memory_subprocess([2048, 4096] if a.quick else [2048, 4096, 8192], a.threads)
    growth = mem[-1]["backward_extra_mib"] / max(mem[-2]["backward_extra_mib"], 1e-9)
    print(f"backward memory seq {mem[-2]['seq']} -> {mem[-1]['seq']}: x{growth:.2f} (linear: 2x; must be <= 2.2x)")
    out = Path(a.out)
    stem = f"attention-backward-cpu-fp32-t{a.threads}"
    report.write_json(out / f"{stem}.json", {**report.metadata("cpu", torch.float32, a.quick),
                                            "load_average_1min": load, "results": [row], "memory": mem,
                                            "memory_growth_last_doubling": growth,
                                            "target": {"speedup_vs_sdpa": TARGET,
                                                       "met": row["speedup_vs_sdpa"] >= TARGET}})
    print(f"wrote {out / stem}.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
