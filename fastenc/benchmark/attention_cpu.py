"""Attention on the CPU: fastenc's C++ kernel against torch SDPA and the fp32 reference, equal padded shapes,
a variable-length batch, and peak memory growth with sequence length.

Measured in one process, fastenc and SDPA interleaved (ABAB) so both see the same machine state:
  fastenc    fastenc.ops.attention(..., backend="cpu")   padded (batch, seq, heads, 64) or packed varlen
  sdpa       torch.nn.functional.scaled_dot_product_attention on the padded batch (bool key mask if padded)
  reference  fastenc.reference.attention (fp32, materializes seq x seq)
Equal shapes: seq 128, 512, 2048 at 2048 tokens per batch, heads 12, head_dim 64, fp32. Varlen: 16 sequences,
lengths uniform in [16, 384] (seed 0); SDPA computes the padded batch, fastenc only the real tokens. Ratios are
SDPA time / fastenc time (> 1: fastenc faster), of medians and of minimums (best-of), plus the ratio of one-thread
CPU times (robust when other processes share the machine). Peak memory: extra resident memory of one call at seq
2048, 4096, 8192, one head (in a fresh process: `python -m fastenc.benchmark.attention_cpu --memory-only SEQS`).
Usage: fastenc bench attention-cpu [--threads 2] [--repeats 7] [--quick] [--out DIR]
Writes DIR/attention-cpu-fp32-t<threads>.json and .png.
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
from fastenc.benchmark import options, report, timing
from fastenc.benchmark.ops._common import varlen_lengths
from fastenc.reference.attention import attention_ref, attention_varlen_ref

HEADS, HEAD_DIM = 12, 64
TARGETS = {"seq512": 0.9, "varlen": 2.0}  # fastenc speed / SDPA speed to reach


def _rand(*shape, gen):
    return torch.randn(*shape, generator=gen)


def _measure(fns: dict, repeats: int, tokens: int) -> dict:
    # fastenc and SDPA interleaved with each other; the reference (hundreds of MiB per call at long sequences,
    # which evicts everything) timed on its own so it does not disturb the pair being compared.
    pair = {k: fns[k] for k in ("fastenc", "sdpa")}
    samples = timing.interleaved(pair, "cpu", warmup=1, repeats=repeats, min_time_s=1.0, max_repeats=50)
    stats = {k: timing.summarize(v) for k, v in samples.items()}
    if "reference" in fns:
        stats["reference"] = timing.time_fn(fns["reference"], "cpu", warmup=1, repeats=3)
    row = {}
    for k, s in stats.items():
        row[f"{k}_ms"] = s.median_ms
        row[f"{k}_min_ms"] = s.min_ms
        row[f"{k}_tokens_per_s"] = tokens / (s.median_ms / 1e3)
    row["speedup_vs_sdpa"] = stats["sdpa"].median_ms / stats["fastenc"].median_ms
    row["speedup_vs_sdpa_min"] = stats["sdpa"].min_ms / stats["fastenc"].min_ms
    if "reference" in stats:
        row["speedup_vs_reference"] = stats["reference"].median_ms / stats["fastenc"].median_ms
    row["speedup_vs_sdpa_cpu_time_1thread"] = _cpu_time_ratio(fns["fastenc"], fns["sdpa"], repeats)
    return row


def _cpu_time_ratio(ours, sdpa, repeats: int) -> float:
    """SDPA / fastenc CPU time of the calling thread with one thread each, interleaved, medians: a ratio that
    other processes on the machine barely move (they take wall time, not this thread's CPU time)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        t = timing.interleaved({"fastenc": ours, "sdpa": sdpa}, "cpu", warmup=1, repeats=max(9, repeats),
                               clock=time.thread_time)
    finally:
        torch.set_num_threads(threads)
    med = {k: sorted(v)[len(v) // 2] for k, v in t.items()}
    return med["sdpa"] / med["fastenc"]


def equal_shapes(seqs: list[int], tokens: int, repeats: int, with_ref: bool) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    rows = []
    for s in seqs:
        b = max(1, tokens // s)
        q, k, v = (_rand(b, s, HEADS, HEAD_DIM, gen=gen) for _ in range(3))
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # (b, h, s, d) views of the same data
        fns = {"fastenc": lambda: fastenc.ops.attention(q, k, v, backend="cpu"),
               "sdpa": lambda: F.scaled_dot_product_attention(qt, kt, vt)}
        if with_ref:
            fns["reference"] = lambda: attention_ref(q, k, v)
        row = {"case": f"seq{s}", "batch": b, "seq": s, "useful_tokens": b * s,
               **_measure(fns, repeats if s < 2048 else max(3, repeats // 2), b * s)}
        rows.append(row)
        _print(row)
    return rows


def varlen(repeats: int, with_ref: bool) -> dict:
    gen = torch.Generator().manual_seed(0)
    lens = varlen_lengths()
    total, longest, b = sum(lens), max(lens), len(lens)
    q, k, v = (_rand(total, HEADS, HEAD_DIM, gen=gen) for _ in range(3))
    cu = torch.zeros(b + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lens).cumsum(0)
    mask = torch.arange(longest)[None, :] < torch.tensor(lens)[:, None]  # (b, longest) True = real token

    def pad(x):
        out = x.new_zeros(b, longest, HEADS, HEAD_DIM)
        out[mask] = x
        return out.transpose(1, 2)  # (b, h, s, d) for SDPA

    qp, kp, vp = pad(q), pad(k), pad(v)
    attn_mask = mask[:, None, None, :]
    fns = {"fastenc": lambda: fastenc.ops.attention(q, k, v, cu_seqlens=cu, max_seqlen=longest, backend="cpu"),
           "sdpa": lambda: F.scaled_dot_product_attention(qp, kp, vp, attn_mask=attn_mask)}
    if with_ref:
        fns["reference"] = lambda: attention_varlen_ref(q, k, v, cu)
    row = {"case": "varlen", "batch": b, "seq": longest, "lengths": lens, "useful_tokens": total,
           "padded_tokens": b * longest, **_measure(fns, repeats, total)}
    _print(row)
    return row


def memory_subprocess(seqs: list[int], with_ref: bool, threads: int) -> list[dict]:
    """Run `memory` in a fresh process whose allocator maps every block >= 64 KiB afresh (glibc's
    MALLOC_MMAP_THRESHOLD_), so the resident-set peak shows each call's own allocations instead of reused heap."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    cmd = [sys.executable, "-m", "fastenc.benchmark.attention_cpu", "--memory-only", ",".join(map(str, seqs)),
           "--threads", str(threads)]
    if not with_ref:
        cmd.append("--no-reference")
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    lines = res.stdout.splitlines()
    print("\n".join(ln for ln in lines if ln.startswith("peak memory")), flush=True)
    return json.loads(next(ln for ln in lines if ln.startswith("[")))


def memory(seqs: list[int], with_ref: bool) -> list[dict]:
    """Extra resident memory of one call, one sequence, one head: fastenc's grows with seq (its output plus
    O(tile) working memory per thread), the reference's with seq^2 (the score matrix)."""
    gen = torch.Generator().manual_seed(0)
    rows = []
    for s in seqs:
        q, k, v = (_rand(1, s, 1, HEAD_DIM, gen=gen) for _ in range(3))
        fastenc.ops.attention(q, k, v, backend="cpu")  # warm: extension loaded, threads started
        row = {"seq": s, "qkv_mib": 3 * q.numel() * 4 / 2**20, "output_mib": q.numel() * 4 / 2**20,
               "scores_mib": s * s * 4 / 2**20}
        row["fastenc_mib"], how = timing.peak_memory(lambda: fastenc.ops.attention(q, k, v, backend="cpu"))
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        row["sdpa_mib"], _ = timing.peak_memory(lambda: F.scaled_dot_product_attention(qt, kt, vt))
        if with_ref:
            row["reference_mib"], _ = timing.peak_memory(lambda: attention_ref(q, k, v))
        row["method"] = how
        rows.append(row)
        print(f"peak memory seq {s:5d}: fastenc {row['fastenc_mib']:7.1f} MiB | sdpa {row['sdpa_mib']:7.1f} MiB"
              + (f" | reference {row['reference_mib']:7.1f} MiB" if with_ref else "")
              + f"   (output {row['output_mib']:.1f} MiB, one score matrix {row['scores_mib']:.0f} MiB)", flush=True)
    return rows


def _print(row: dict) -> None:
    ref = f" | reference {row['reference_ms']:8.2f} ms" if "reference_ms" in row else ""
    print(f"{row['case']:>7} b={row['batch']:<3d}: fastenc {row['fastenc_ms']:8.2f} ms "
          f"({row['fastenc_tokens_per_s'] / 1e3:7.1f} k useful tok/s) | sdpa {row['sdpa_ms']:8.2f} ms "
          f"({row['sdpa_tokens_per_s'] / 1e3:7.1f} k tok/s){ref} | speed vs sdpa: median {row['speedup_vs_sdpa']:.2f}x,"
          f" best-of {row['speedup_vs_sdpa_min']:.2f}x, 1-thread CPU time {row['speedup_vs_sdpa_cpu_time_1thread']:.2f}x",
          flush=True)


def plot(rows: list[dict], mem: list[dict], path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    names = [r["case"] for r in rows]
    ax.bar(range(len(rows)), [r["speedup_vs_sdpa"] for r in rows], 0.6, label="median")
    ax.scatter(range(len(rows)), [r["speedup_vs_sdpa_min"] for r in rows], color="k", s=12, zorder=3,
               label="best-of")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(rows)), names)
    ax.set_ylabel("SDPA time / fastenc time")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    if mem:
        seqs = [m["seq"] for m in mem]
        for key, label in (("fastenc_mib", "fastenc cpu"), ("sdpa_mib", "sdpa"), ("reference_mib", "reference")):
            if key in mem[0]:
                ax2.plot(seqs, [max(m[key], 1e-2) for m in mem], marker="o", label=label)
        ax2.set_xscale("log", base=2)
        ax2.set_yscale("log")
        ax2.set_xlabel("seq (1 head, head_dim 64)")
        ax2.set_ylabel("extra peak memory (MiB)")
        ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


COMMAND = "attention-cpu"
HELP = ("the CPU attention kernel vs torch SDPA at equal shapes and the varlen batch, and its peak memory against "
        "sequence length (--quick: seq 128/512, memory to 4096)")


def add_arguments(p) -> None:
    options.no_plots(p)
    p.add_argument("--tokens", type=int, default=2048, help="tokens per equal-shape batch")
    p.add_argument("--no-reference", action="store_true", help="skip the (slow, seq^2 memory) reference")


def command(a, device: str, dtype, out: Path) -> dict:
    with_ref = not a.no_reference
    repeats = 3 if a.quick else a.repeats or 7
    a.threads = torch.get_num_threads()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    print(f"attention on CPU, {a.threads} threads, fp32, heads {HEADS}, head_dim {HEAD_DIM}; load average "
          f"{load:.1f} (other work on the machine skews every provider alike: the timing is interleaved)")
    rows = equal_shapes([128, 512] if a.quick else [128, 512, 2048], a.tokens, repeats, with_ref)
    rows.append(varlen(repeats, with_ref))
    mem = memory_subprocess([2048, 4096] if a.quick else [2048, 4096, 8192], with_ref, a.threads)
    by = {r["case"]: r for r in rows}
    verdict = {}
    for case, target in TARGETS.items():
        got = by[case]["speedup_vs_sdpa"]
        cpu1 = by[case]["speedup_vs_sdpa_cpu_time_1thread"]
        verdict[case] = {"target": target, "median": got, "best_of": by[case]["speedup_vs_sdpa_min"],
                         "cpu_time_1thread": cpu1, "met": got >= target}
        print(f"target {case}: fastenc/sdpa speed {got:.2f}x (best-of {by[case]['speedup_vs_sdpa_min']:.2f}x, "
              f"1-thread CPU time {cpu1:.2f}x), needs >= {target}x: {'met' if got >= target else 'NOT met'}")
    if len(mem) >= 2:
        f0, f1 = mem[0], mem[-1]
        grow = f1["seq"] / f0["seq"]
        print(f"memory growth seq {f0['seq']} -> {f1['seq']} (x{grow:.0f}): fastenc "
              f"{f0['fastenc_mib']:.1f} -> {f1['fastenc_mib']:.1f} MiB; one score matrix grows x{grow ** 2:.0f}")
    stem = f"attention-cpu-fp32-t{a.threads}"
    path = report.write_json(out / f"{stem}.json", {**report.metadata("cpu", torch.float32, a.quick),
                                            "load_average_1min": load, "results": rows, "memory": mem,
                                            "targets": verdict})
    if not a.no_plots:
        plot(rows, mem, out / f"{stem}.png", f"attention, CPU fp32, {a.threads} threads, heads {HEADS} x {HEAD_DIM}")
    return {"files": [path] + ([] if a.no_plots else [out / f"{stem}.png"]), "failures": []}


def main(argv=None) -> int:
    """The memory subprocess: `--memory-only SEQS [--threads N] [--no-reference]` prints its rows as JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--memory-only", metavar="SEQS", required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-reference", action="store_true")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    print(json.dumps(memory([int(s) for s in a.memory_only.split(",")], not a.no_reference)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
