"""Attention dropout on the CPU: what dropout_p = 0.1 costs in a training step's attention (forward + backward), and
that dropout_p = 0 costs what it did before dropout existed.

Measured in one process, the variants interleaved (one call of each per round, the order rotated every round) so
all see the same machine state; each figure is the median over rounds of the per-round ratio, with its 25-75 %
spread (and again with one thread on the calling thread's CPU clock, which other processes' load disturbs less):
  p0.1 / p0   fastenc.ops.attention(..., dropout_p=0.1 or 0, backend="cpu") then .backward(grad): the user's path,
              the seed draw included
  after / before   dropout_p = 0, the extension's attention + attention_bwd called directly: this tree's build
              against a build of the C++ sources at --baseline (a git revision, default the commit before dropout)
Workload: 16 sequences, lengths uniform in [16, 384] (torch.Generator seed 0), 12 heads, head_dim 64, fp32.
The dropout overhead is also given per hashed element (forward and backward each hash every visible
(query, key) element once) in ns, next to the fp32 FLOPs per element (fwd + bwd: 14 d = 896 at d = 64).
Usage: python bench/attention_dropout.py [--threads 2] [--rounds 15] [--baseline REV] [--quick]
Writes bench/out/attention-dropout-cpu-fp32-t<threads>.json.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

import torch

import fastenc
from fastenc import extension
from fastenc.benchmark import report
from fastenc.benchmark.kernels import varlen_lengths

HEADS, HEAD_DIM, P = 12, 64, 0.1
ROOT = Path(__file__).resolve().parent.parent
BASELINE = "2de05dd"  # the last commit before attention dropout


def _baseline_ext(rev: str):
    """The CPU half of the extension built from the C++ sources of git revision `rev` (its own module name)."""
    from torch.utils.cpp_extension import load

    d = Path(tempfile.gettempdir()) / f"fastenc-bench-baseline-{rev}"
    src = d / "csrc"
    if not src.exists():
        blob = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "csrc"], check=True, capture_output=True).stdout
        with tarfile.open(fileobj=BytesIO(blob)) as tar:
            tar.extractall(d, filter="data")
    build = d / "build"
    build.mkdir(exist_ok=True)
    print(f"building the baseline extension ({rev}) in {build} ...", file=sys.stderr, flush=True)
    sources = [str(src / "bindings.cpp")] + sorted(map(str, (src / "cpu").glob("*.cpp")))
    return load(name="fastenc_ext_cpu_baseline", sources=sources,
                extra_cflags=extension.cflags() + extension.define_flags("cpu"), extra_ldflags=["-fopenmp"],
                extra_include_paths=[str(src / "common"), str(src)], build_directory=str(build))


def _quantiles(xs: list[float]) -> dict:
    t = torch.tensor(xs, dtype=torch.float64)
    q = torch.quantile(t, torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64)).tolist()
    return {"median": q[1], "p25": q[0], "p75": q[2], "n": len(xs)}


def _interleaved(fns: dict, rounds: int, clock=time.perf_counter) -> dict[str, list[float]]:
    """Seconds per call of each fn, one call of each per round, order rotated every round (two warm-up rounds)."""
    names = list(fns)
    times = {n: [] for n in names}
    for r in range(rounds + 2):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            t0 = clock()
            fns[n]()
            if r >= 2:
                times[n].append(clock() - t0)
    return times


def _one_thread_cpu_time(fns: dict, rounds: int) -> dict[str, list[float]]:
    """As _interleaved, with one thread, on the calling thread's CPU clock (robust to other processes' load)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _interleaved(fns, rounds, time.thread_time)
    finally:
        torch.set_num_threads(threads)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--baseline", default=BASELINE, help="git revision whose C++ sources are the p = 0 baseline")
    p.add_argument("--quick", action="store_true", help="5 rounds")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "out"))
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    rounds = 5 if a.quick else a.rounds
    lens = varlen_lengths()
    total = sum(lens)
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
    gen = torch.Generator().manual_seed(0)
    q, k, v, g = (torch.randn(total, HEADS, HEAD_DIM, generator=gen) for _ in range(4))
    scale, longest = HEAD_DIM ** -0.5, max(lens)
    ext, base = extension.load(), _baseline_ext(a.baseline)

    def train_step(dropout_p):
        def run():
            leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
            fastenc.ops.attention(*leaves, cu_seqlens=cu, dropout_p=dropout_p, backend="cpu").backward(g)
        return run

    def direct(mod):
        def run():
            out, lse = mod.attention(q, k, v, cu, longest, -1, -1, scale)
            mod.attention_bwd(g, q, k, v, out, lse, cu, longest, -1, -1, scale)
        return run

    load0 = os.getloadavg()[0]
    t = _interleaved({"p0": train_step(0.0), "p0.1": train_step(P), "after": direct(ext), "before": direct(base)},
                     rounds)
    out0, lse = ext.attention(q, k, v, cu, longest, -1, -1, scale)
    out1, _ = ext.attention(q, k, v, cu, longest, -1, -1, scale, P, 1, 2)
    kernels = {  # the kernels alone (no autograd, no seed draw): forward, backward, without and with dropout
        "fwd p0": lambda: ext.attention(q, k, v, cu, longest, -1, -1, scale),
        "fwd p0.1": lambda: ext.attention(q, k, v, cu, longest, -1, -1, scale, P, 1, 2),
        "bwd p0": lambda: ext.attention_bwd(g, q, k, v, out0, lse, cu, longest, -1, -1, scale),
        "bwd p0.1": lambda: ext.attention_bwd(g, q, k, v, out1, lse, cu, longest, -1, -1, scale, P, 1, 2)}
    t1 = _one_thread_cpu_time({"p0": train_step(0.0), "p0.1": train_step(P), "after": direct(ext),
                               "before": direct(base), **kernels}, max(5, rounds // 3))
    load1 = os.getloadavg()[0]
    drop = _quantiles([x / y for x, y in zip(t["p0.1"], t["p0"])])
    same = _quantiles([x / y for x, y in zip(t["after"], t["before"])])
    drop1 = _quantiles([x / y for x, y in zip(t1["p0.1"], t1["p0"])])
    same1 = _quantiles([x / y for x, y in zip(t1["after"], t1["before"])])
    fwd1 = _quantiles([x / y for x, y in zip(t1["fwd p0.1"], t1["fwd p0"])])
    bwd1 = _quantiles([x / y for x, y in zip(t1["bwd p0.1"], t1["bwd p0"])])
    med = {n: _quantiles(v)["median"] for n, v in t.items()}
    elements = 2 * HEADS * sum(s * s for s in lens)  # hashed once in the forward, once in the backward
    per_elem_ns = (med["p0.1"] - med["p0"]) / elements * 1e9
    print(f"attention fwd+bwd on CPU, {a.threads} threads, fp32, 16 seqs in [16, 384] ({total} tokens), {HEADS} x "
          f"{HEAD_DIM}; load average {load0:.1f} -> {load1:.1f}; {rounds} rounds")
    print(f"dropout_p={P} / 0:  {drop['median']:.3f}x  (25-75 %: {drop['p25']:.3f} - {drop['p75']:.3f}); medians "
          f"{med['p0.1'] * 1e3:.1f} / {med['p0'] * 1e3:.1f} ms; {per_elem_ns:.2f} ns per hashed element")
    print(f"p=0 after / before ({a.baseline}):  {same['median']:.3f}x  (25-75 %: {same['p25']:.3f} - "
          f"{same['p75']:.3f}); medians {med['after'] * 1e3:.1f} / {med['before'] * 1e3:.1f} ms")
    print(f"one thread, CPU time:  dropout {drop1['median']:.3f}x ({drop1['p25']:.3f} - {drop1['p75']:.3f}),  "
          f"p=0 after / before {same1['median']:.3f}x ({same1['p25']:.3f} - {same1['p75']:.3f});  kernels alone: "
          f"forward {fwd1['median']:.3f}x ({fwd1['p25']:.3f} - {fwd1['p75']:.3f}), backward {bwd1['median']:.3f}x "
          f"({bwd1['p25']:.3f} - {bwd1['p75']:.3f})")
    out = Path(a.out)
    stem = f"attention-dropout-cpu-fp32-t{a.threads}"
    report.write_json(out / f"{stem}.json", {
        **report.metadata("cpu", torch.float32, a.quick), "load_average_1min": [load0, load1], "lengths": lens,
        "heads": HEADS, "head_dim": HEAD_DIM, "dropout_p": P, "baseline": a.baseline,
        "ratio_dropout_vs_p0": drop, "ratio_p0_after_vs_before": same, "median_seconds": med,
        "one_thread_cpu_time": {"ratio_dropout_vs_p0": drop1, "ratio_p0_after_vs_before": same1,
                                "ratio_dropout_vs_p0_forward_kernel": fwd1, "ratio_dropout_vs_p0_backward_kernel": bwd1,
                                "seconds": t1},
        "dropout_ns_per_hashed_element": per_elem_ns, "seconds": t})
    print(f"wrote {out / stem}.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
