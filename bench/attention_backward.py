"""Attention forward + backward (training) on the CPU, and the backward's working memory against sequence length.

Timing: the attention case of `fastenc bench kernels --backward` (fastenc/benchmark/backward.py): fastenc on the
packed variable-length batch (16 sequences, lengths uniform in [16, 384], seed 0, 12 heads, head_dim 64) against
torch SDPA fwd+bwd on the padded batch, interleaved in one process, paired ratios with their spread, FLOPs as a
fraction of the fp32 GEMM rate measured in the same run.
Memory: extra resident memory of one backward call (fresh process, every block >= 64 KiB mapped afresh), one
sequence, one head, seq 2048 / 4096 / 8192: it must grow linearly (8192 at most 2.2x of 4096).
Usage: python bench/attention_backward.py [--threads 2] [--repeats 7] [--quick] [--no-compile]
Writes bench/out/attention-backward-cpu-fp32-t<threads>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

import fastenc
from fastenc.benchmark import backward, ceilings, report, timing

HEADS, HEAD_DIM = 12, 64
TARGET = 2.0  # fastenc fwd+bwd speed / SDPA fwd+bwd speed


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
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "out"))
    p.add_argument("--memory-only", metavar="SEQS", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    if a.memory_only:
        print(json.dumps(memory([int(s) for s in a.memory_only.split(",")])))
        return 0
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    print(f"attention fwd+bwd on CPU, {a.threads} threads, fp32; load average {load:.1f}")
    case = next(c for c in backward.backward_cases(quick=False) if c.op == "attention")
    ceil = ceilings.measure("cpu", torch.float32, quick=a.quick)
    row = backward.run_case(case, "cpu", torch.float32, ceil, repeats=3 if a.quick else a.repeats,
                            compile_ref=not a.no_compile)
    print(backward.table([row]))
    mem = memory_subprocess([2048, 4096] if a.quick else [2048, 4096, 8192], a.threads)
    growth = mem[-1]["backward_extra_mib"] / max(mem[-2]["backward_extra_mib"], 1e-9)
    print(f"backward memory seq {mem[-2]['seq']} -> {mem[-1]['seq']}: x{growth:.2f} (linear: 2x; must be <= 2.2x)")
    out = Path(a.out)
    stem = f"attention-backward-cpu-fp32-t{a.threads}"
    ratio = row["sdpa_over_fastenc"]["median"]
    report.write_json(out / f"{stem}.json", {**report.metadata("cpu", torch.float32, a.quick),
                                            "load_average_1min": load, "ceilings": ceil, "results": [row],
                                            "memory": mem, "memory_growth_last_doubling": growth,
                                            "target": {"sdpa_over_fastenc": TARGET, "met": ratio >= TARGET}})
    print(f"wrote {out / stem}.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
