"""LoRA inference cost on one device: fused unmerged lora_linear and the merged path against a plain linear.

Measured in one process, interleaved (ABAB) so every provider sees the same machine state:
  plain       F.linear(x, W, b)                                  -- the baseline every ratio divides by
  unmerged    fastenc.ops.lora_linear(x, W, b, A, B, scale)       -- the fused/fast backend of this device
  peft-style  F.linear(x, W, b) + F.linear(F.linear(x, A), B) * scale  (PEFT's unmerged forward)
  merged      F.linear(x, W', b), W' = fastenc.ops.merge_lora(W, A, B, scale): the merged model's cost
plus the one-off merge time. Ratios of medians and of minimums (best-of, robust when the machine is shared).
Default: CPU, fp32, hidden 768, tokens 4096, r = 8, 16, 64.
Usage: fastenc bench lora [--device cuda --dtype bf16] [--tokens 4096 --hidden 768 --ranks 8,16,64] [--out DIR]
Writes DIR/lora-<device>-<dtype>-t<threads>.json and .png. On a CPU shared with other work, each extra
parallel region of the unmerged path can lose a scheduler slice: compare --threads 1 with the default.
"""
from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import fastenc
from fastenc.benchmark import options, report, timing

COMMAND = "lora"
HELP = "LoRA inference cost: fused unmerged lora_linear, PEFT's unmerged form and the merged weight vs a plain linear"


def run(device: str, dtype: torch.dtype, tokens: int, hidden: int, ranks: list[int], repeats: int) -> list[dict]:
    g = torch.Generator().manual_seed(0)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)

    x = rnd(tokens, hidden)
    w, b = rnd(hidden, hidden, scale=hidden ** -0.5), rnd(hidden)
    rows = []
    for r in ranks:
        a, bb, scale = rnd(r, hidden, scale=hidden ** -0.5), rnd(hidden, r, scale=0.1), 16.0 / r
        merged_w = fastenc.ops.merge_lora(w, a, bb, scale)
        fns = {
            "plain": lambda: F.linear(x, w, b),
            "unmerged": lambda: fastenc.ops.lora_linear(x, w, b, a, bb, scale),
            "peft-style": lambda: F.linear(x, w, b) + F.linear(F.linear(x, a), bb) * scale,
            "merged": lambda: F.linear(x, merged_w, b),
        }
        impl = fastenc.registry.select("lora_linear", {"x": x, "weight": w, "bias": b, "lora_a": a, "lora_b": bb})
        samples = timing.interleaved(fns, device, warmup=2, repeats=repeats, min_time_s=1.0, max_repeats=200)
        cpu_ms = None
        if device == "cpu" and torch.get_num_threads() == 1:  # CPU time of the (only) compute thread, per call
            thread = timing.interleaved(fns, "cpu", warmup=0, repeats=repeats, clock=time.thread_time)
            cpu_ms = {k: statistics.median(v) for k, v in thread.items()}
        stats = {k: timing.summarize(v) for k, v in samples.items()}
        merge = timing.time_fn(lambda: fastenc.ops.merge_lora(w, a, bb, scale), device, warmup=1, repeats=10)
        base, base_min = stats["plain"].median_ms, stats["plain"].min_ms
        row = {"rank": r, "tokens": tokens, "hidden": hidden, "lora_linear_backend": impl.backend,
               "merge_backend": fastenc.registry.select("merge_lora", {"weight": w}).backend,
               "merge_once_ms": merge.median_ms}
        for k, s in stats.items():
            row[f"{k}_ms"] = s.median_ms
            row[f"{k}_ratio"] = s.median_ms / base
            row[f"{k}_min_ratio"] = s.min_ms / base_min  # best-of: robust on a machine shared with other work
        if cpu_ms is not None:  # CPU time of the (only) compute thread: blind to time spent descheduled
            for k, v in cpu_ms.items():
                row[f"{k}_cpu_time_ratio"] = v / cpu_ms["plain"]
        row["extra_flops_fraction"] = r * (hidden + hidden) / (hidden * hidden)
        rows.append(row)
        print(f"r={r:3d}  plain {base:7.2f} ms (min {base_min:.2f}) | ratios median/min: unmerged ({impl.backend}) "
              f"{row['unmerged_ratio']:.3f}/{row['unmerged_min_ratio']:.3f} | peft-style "
              f"{row['peft-style_ratio']:.3f}/{row['peft-style_min_ratio']:.3f} | merged "
              f"{row['merged_ratio']:.3f}/{row['merged_min_ratio']:.3f} | merge once {merge.median_ms:.2f} ms",
              flush=True)
        if cpu_ms is not None:
            print(f"       thread CPU time ratios: unmerged {row['unmerged_cpu_time_ratio']:.3f} | peft-style "
                  f"{row['peft-style_cpu_time_ratio']:.3f} | merged {row['merged_cpu_time_ratio']:.3f}", flush=True)
    return rows


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    provs = ["unmerged", "peft-style", "merged"]
    width = 0.8 / len(provs)
    for i, p in enumerate(provs):
        ax.bar([j + i * width for j in range(len(rows))], [r[f"{p}_ratio"] for r in rows], width, label=p)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(1.15, color="r", lw=0.8, ls="--", label="1.15x target")
    ax.set_xticks([j + width for j in range(len(rows))], [f"r={r['rank']}" for r in rows])
    ax.set_ylabel("time / plain linear")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def add_arguments(p) -> None:
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--ranks", default="8,16,64")
    options.no_plots(p)


def command(a, device: str, dtype: torch.dtype, out: Path) -> dict:
    rows = run(device, dtype, a.tokens, a.hidden, list(options.ints(a.ranks, ())), a.repeats or 15)
    name = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
    stem = f"lora-{device}-{name}-t{torch.get_num_threads()}"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None  # other work on the machine skews CPU runs
    files = [report.write_json(out / f"{stem}.json", {**report.metadata(device, dtype, False),
                                                       "load_average_1min": load, "results": rows})]
    if not a.no_plots:
        plot(rows, out / f"{stem}.png",
             f"LoRA linear, {device} {name}, {a.tokens}x{a.hidden}, {torch.get_num_threads()} threads")
        files.append(out / f"{stem}.png")
    return {"files": files, "failures": []}
