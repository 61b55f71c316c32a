"""Training-step cost of the norms and of the unmerged LoRA linear: forward + backward, side by side in one process.

Providers, interleaved round-robin (fastenc.benchmark.timing.interleaved) so each sees the same machine state:
  layer_norm (BERT: (tokens, 768) + residual, bias; grads of x, weight, bias, residual and an upstream dh):
    fastenc        fastenc.ops.layer_norm(x, w, b, residual=r) -> (y, h), backward of (y, h)
    torch-eager    h = x + r; y = F.layer_norm(h, ...) under autograd (the same math, PyTorch's own kernels)
    torch-compile  the eager function through torch.compile (inductor: one fused forward and backward)
  rms_norm: the same with F.rms_norm.
  lora_linear (4096 tokens, 768 -> 768, r = 8; base weight frozen: grads of x, A, B):
    fastenc        fastenc.ops.lora_linear(x, W, b, A, B, s)
    peft-style     F.linear(x, W, b) + F.linear(F.linear(x, A), B) * s under autograd (PEFT's unmerged forward)
Ceilings measured in the same run: copy bandwidth (a large tensor copy, bytes read + written per second) against the
norms' byte count (forward reads x, r and writes y, h; backward reads dy, dh, h and writes dx: 8 tensors of
tokens x hidden), and the large-GEMM rate against lora_linear's flops (forward 2 T in out + rank terms, backward
dx's 2 T in out + rank terms; no dW GEMM: the base weight is frozen).
Usage: python bench/norm_lora_backward.py [--threads 2 --tokens 4096 --hidden 768 --rank 8 --no-compile]
Writes bench/results/norm_lora_backward-cpu-fp32-t<threads>.json and prints a table.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import fastenc
from fastenc.benchmark import report, timing


def _median(xs):
    return statistics.median(xs)


def copy_bandwidth(nbytes: int = 256 * 2**20, repeats: int = 15) -> float:
    """Bytes per second of dst.copy_(src) (read + write counted), the best of `repeats` (a ceiling)."""
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return 2 * nbytes / best


def gemm_rate(n: int = 2048, repeats: int = 7) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best


def norm_case(kind: str, tokens: int, hidden: int, compile_: bool, min_time: float) -> dict:
    g = torch.Generator().manual_seed(0)
    x0, r0 = torch.randn(tokens, hidden, generator=g), torch.randn(tokens, hidden, generator=g)
    w0, b0 = torch.randn(hidden, generator=g), torch.randn(hidden, generator=g)
    gy, gh = torch.randn(tokens, hidden, generator=g), torch.randn(tokens, hidden, generator=g)
    x, r, w, b = (t.clone().requires_grad_() for t in (x0, r0, w0, b0))
    params = (x, w, b, r) if kind == "layer_norm" else (x, w, r)

    def ours():
        if kind == "layer_norm":
            y, h = fastenc.ops.layer_norm(x, w, b, 1e-5, residual=r)
        else:
            y, h = fastenc.ops.rms_norm(x, w, 1e-6, residual=r)
        return torch.autograd.grad((y, h), params, (gy, gh))

    def eager_math(x, w, b, r):
        h = x + r
        y = F.layer_norm(h, (hidden,), w, b, 1e-5) if kind == "layer_norm" else F.rms_norm(h, (hidden,), w, 1e-6)
        return y, h

    def eager():
        y, h = eager_math(x, w, b, r)
        return torch.autograd.grad((y, h), params, (gy, gh))

    fns = {"fastenc": ours, "torch-eager": eager}
    if compile_:
        compiled = torch.compile(eager_math)

        def comp():
            y, h = compiled(x, w, b, r)
            return torch.autograd.grad((y, h), params, (gy, gh))
        fns["torch-compile"] = comp
    # the gradients agree before anything is timed
    for a_, b_ in zip(ours(), eager()):
        torch.testing.assert_close(a_, b_, rtol=2e-4, atol=2e-4)
    samples = timing.interleaved(fns, "cpu", warmup=3, repeats=9, min_time_s=min_time, max_repeats=200)
    med = {k: _median(v) for k, v in samples.items()}
    nbytes = 8 * tokens * hidden * 4  # fwd: x, r in; y, h out; bwd: dy, dh, h in; dx out
    return {"op": kind, "shape": f"{tokens}x{hidden}+res", "median_ms": med, "bytes": nbytes,
            "ratios_vs_fastenc": {k: v / med["fastenc"] for k, v in med.items()}}


def lora_case(tokens: int, hidden: int, rank: int, min_time: float) -> dict:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(tokens, hidden, generator=g).requires_grad_()
    w, b = torch.randn(hidden, hidden, generator=g) * hidden ** -0.5, torch.randn(hidden, generator=g)
    a = (torch.randn(rank, hidden, generator=g) * hidden ** -0.5).requires_grad_()
    bb = (torch.randn(hidden, rank, generator=g) * 0.1).requires_grad_()
    gy, s = torch.randn(tokens, hidden, generator=g), 16.0 / rank

    def ours():
        return torch.autograd.grad(fastenc.ops.lora_linear(x, w, b, a, bb, s), (x, a, bb), gy)

    def peft():
        y = F.linear(x, w, b) + F.linear(F.linear(x, a), bb) * s
        return torch.autograd.grad(y, (x, a, bb), gy)

    for a_, b_ in zip(ours(), peft()):
        torch.testing.assert_close(a_, b_, rtol=1e-3, atol=1e-3)
    samples = timing.interleaved({"fastenc": ours, "peft-style": peft}, "cpu", warmup=3, repeats=9,
                                 min_time_s=min_time, max_repeats=200)
    med = {k: _median(v) for k, v in samples.items()}
    flops = 2 * tokens * hidden * hidden * 2 + 2 * tokens * rank * hidden * 6
    return {"op": "lora_linear", "shape": f"{tokens}x{hidden}->{hidden} r{rank}", "median_ms": med, "flops": flops,
            "ratios_vs_fastenc": {k: v / med["fastenc"] for k, v in med.items()}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--min-time", type=float, default=2.0)
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    bw, rate = copy_bandwidth(), gemm_rate()
    rows = [norm_case(k, args.tokens, args.hidden, not args.no_compile, args.min_time) for k in ("layer_norm", "rms_norm")]
    rows.append(lora_case(args.tokens, args.hidden, args.rank, args.min_time))
    print(f"copy bandwidth {bw / 1e9:.1f} GB/s, GEMM {rate / 1e9:.0f} GFLOP/s, {args.threads} threads")
    for row in rows:
        ms = row["median_ms"]["fastenc"]
        line = f"{row['op']:12s} {row['shape']:22s} fastenc {ms:8.2f} ms"
        for k, v in row["ratios_vs_fastenc"].items():
            if k != "fastenc":
                line += f" | {k} {row['median_ms'][k]:8.2f} ms ({v:.2f}x fastenc's time)"
        if "bytes" in row:
            row["floor_ms"] = row["bytes"] / bw * 1e3
            line += f" | byte floor {row['floor_ms']:.2f} ms ({row['floor_ms'] / ms:.0%} of copy bandwidth)"
        else:
            row["floor_ms"] = row["flops"] / rate * 1e3
            line += f" | GEMM floor {row['floor_ms']:.2f} ms ({row['floor_ms'] / ms:.0%} of the GEMM rate)"
        print(line)
    meta = report.metadata("cpu", torch.float32, quick=False)
    meta.update(threads=args.threads, copy_bandwidth_Bps=bw, gemm_flops=rate)
    out = report.write_json(Path(args.out) / f"norm_lora_backward-cpu-fp32-t{args.threads}.json",
                            {"meta": meta, "rows": rows})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
