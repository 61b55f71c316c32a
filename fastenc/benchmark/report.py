"""Benchmark reports: machine/versions/commit metadata, JSON + CSV files, PNG plots (matplotlib, Agg backend)
and the terminal table. Plots: throughput bars per provider, and a roofline-style plot of each kernel
(arithmetic intensity vs achieved rate, under the measured copy-bandwidth and GEMM-rate ceilings).
"""
from __future__ import annotations

import csv
import datetime as _dt
import importlib.metadata as md
import json
import math
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

from fastenc.benchmark.tables import _fmt, _md_table, table  # noqa: F401  (report.table: the callers' name)


def _ver(name: str) -> str:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "not installed"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags(names=("avx2", "avx512_vnni", "amx_int8")) -> dict[str, bool] | None:
    """Whether the CPU reports each of `names` in /proc/cpuinfo's flags (None where that cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return {n: n in have for n in names}
    except OSError:
        pass
    return None


def commit() -> str:
    """git commit of the fastenc checkout (+ '-dirty' when it has uncommitted changes), or 'unknown'."""
    root = Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        if sha.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10)
        return sha.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def metadata(device: str, dtype: torch.dtype, quick: bool) -> dict:
    """Machine (CPU model, cores, threads, GPU), versions and commit, recorded with every result file."""
    machine = {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(),
               "platform": platform.platform(), "python": platform.python_version(), "cpu_flags": cpu_flags()}
    try:
        machine["loadavg_at_start"] = [round(x, 2) for x in os.getloadavg()]  # other work sharing the cores
    except OSError:
        pass
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        machine["gpu"] = f"{p.name} (sm_{p.major}{p.minor}, {p.total_memory / 2**30:.0f} GiB)"
    versions = {n: _ver(n) for n in ("fastenc", "torch", "triton", "transformers", "onnxruntime", "onnx",
                                     "onnxscript", "flash-attn", "liger-kernel", "numpy")}
    versions["torch"] = torch.__version__
    versions["torch_cuda"] = str(torch.version.cuda)
    return {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "commit": commit(),
            "device": device, "dtype": str(dtype).replace("torch.", ""), "quick": quick, "machine": machine,
            "versions": versions}


def _clean(obj):
    """JSON without NaN/Infinity (written as null)."""
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def write_json(path: Path, payload: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_clean(payload), indent=1) + "\n")
    return path


def write_csv(path: Path, rows: list[dict]) -> Path:
    cols: list[str] = []
    for r in rows:
        for k in r:
            if k not in cols and not isinstance(r[k], (dict, list)):
                cols.append(k)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items() if k in cols})
    return path


def _plt():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        return None


def plot_bars(path: Path, groups: list[str], providers: list[str], values: dict[tuple[str, str], float],
              ylabel: str, title: str) -> Path | None:
    """Grouped bars: one group per case, one bar per provider (missing values leave a gap)."""
    plt = _plt()
    if plt is None or not groups or not providers:
        return None
    width = 0.8 / len(providers)
    fig, ax = plt.subplots(figsize=(min(18.0, max(6.5, 1.1 * len(groups) + 2)), 5))
    for i, p in enumerate(providers):
        xs = [g_i + i * width - 0.4 + width / 2 for g_i in range(len(groups))]
        ys = [values.get((g, p), float("nan")) for g in groups]
        ax.bar(xs, [0 if not math.isfinite(y) else y for y in ys], width, label=p)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_roofline(path: Path, rows: list[dict], ceilings: dict, title: str) -> Path | None:
    """Roofline: x = FLOPs/byte of the op's model, y = achieved GFLOP/s; lines = measured ceilings."""
    plt = _plt()
    timed = [r for r in rows if "median_ms" in r and r.get("flops") and r.get("bytes")]
    if plt is None or not timed:
        return None
    bw = ceilings.get("copy_bandwidth", {}).get("value")
    peak = ceilings.get("gemm_rate", {}).get("value")
    fig, ax = plt.subplots(figsize=(7.5, 5))
    providers = sorted({r["provider"] for r in timed})
    markers = "os^vD<>ph*"
    ops = sorted({r["op"] for r in timed})
    cmap = plt.get_cmap("tab10")
    for r in timed:
        ai = r["flops"] / r["bytes"]
        y = r["flops"] / (r["median_ms"] / 1e3) / 1e9
        ax.scatter(ai, y, color=cmap(ops.index(r["op"]) % 10), marker=markers[providers.index(r["provider"]) % len(markers)],
                   s=28, alpha=0.85)
    ais = [r["flops"] / r["bytes"] for r in timed]
    lo, hi = min(ais) / 2, max(ais) * 2
    if bw and peak:
        knee = peak * 1e3 / bw
        hi = max(hi, knee * 4)
        xs = [lo, min(max(knee, lo), hi), hi]
        ax.plot(xs, [min(bw * x, peak * 1e3) for x in xs], "k-", lw=1.2,
                label=f"ceilings: copy {bw:.3g} GB/s, GEMM {peak * 1e3:.3g} GFLOP/s")
    for i, op in enumerate(ops):
        ax.scatter([], [], color=cmap(i % 10), marker="o", label=op)
    for i, p in enumerate(providers):
        ax.scatter([], [], color="gray", marker=markers[i % len(markers)], label=p)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOPs / byte of the op's model)")
    ax.set_ylabel("achieved GFLOP/s")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=6, loc="lower right", ncol=2)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---- markdown summary (the README's results section) ----

def _machine_line(d: dict) -> str:
    m, v = d["machine"], d["versions"]
    where = m.get("gpu") if d["device"].startswith("cuda") else m["cpu"]
    load = f" (load average {m['loadavg_at_start'][0]:.1f} at start)" if m.get("loadavg_at_start") else ""
    return (f"{where}, {m['cpu_count']} cores{load}, {m['threads']} threads; torch {v['torch']}, transformers "
            f"{v['transformers']}, onnxruntime {v['onnxruntime']}; {d['dtype']}; commit `{d['commit'][:12]}`; {d['date']}")


COMMAND = "report"
HELP = "write RESULTS.md from the JSON files in --out"


def add_arguments(p) -> None:
    """(no options beyond the common ones: --out names the folder read and written)"""


def command(args, device: str, dtype: torch.dtype, out: Path) -> int:
    if not (out / "models.json").exists() and not (out / "kernels.json").exists():
        print(f"fastenc bench report: no models.json or kernels.json in {out}", file=sys.stderr)
        return 2
    (out / "RESULTS.md").write_text(results_markdown(out))
    print(f"wrote {out / 'RESULTS.md'}")
    return 0


def results_markdown(folder: Path) -> str:
    """RESULTS.md text from folder/models.json and folder/kernels.json (whichever exist)."""
    parts = ["## Benchmark results", ""]
    mj, kj = folder / "models.json", folder / "kernels.json"
    d = json.loads(mj.read_text()) if mj.exists() else None
    if d is not None and d.get("quantize"):
        from fastenc.benchmark import int8_report

        parts += [f"Models, int8 (`fastenc bench models --quantize {d['quantize']}"
                  f"{' --quick' if d['quick'] else ''}`): {_machine_line(d)}.", "", int8_report.markdown(d), ""]
    elif d is not None:
        parts += [f"Models (`fastenc bench models{' --quick' if d['quick'] else ''}`): {_machine_line(d)}.",
                  f"Workloads: {d['workloads']['fixed']}; variable length: {d['workloads']['varlen']}. "
                  "Ratios are fastenc's throughput over the baseline's, measured in the same run "
                  "(providers interleaved): of the medians, and paired (the median of the per-round ratios). Peak memory: growth of the process's resident set during one "
                  "fixed-workload call (CPU) or max_memory_allocated (CUDA).", ""]
        if d.get("note"):
            parts += [f"Note: {d['note']}", ""]
        cols = [("model", "model"), ("workload", "workload"), ("provider", "provider"), ("throughput", "throughput"),
                ("unit", "unit"),
                ("latency_p50_ms", "batch-1 p50 ms"), ("latency_p95_ms", "p95 ms"), ("peak_mem_mib", "peak MiB"),
                ("max_abs_err_vs_transformers", "max abs err")]
        rows = d["rows"]
        for b in ("hf-sdpa", "onnxruntime", "hf-eager", "hf-compile"):
            cols += [(f"{k}ratio_vs_{b}", f"fastenc / {b}{' (paired)' if k else ''}") for k in ("", "paired_")
                     if any(f"{k}ratio_vs_{b}" in r for r in rows)]
        shown = [dict(r, **{k: None for k in r if "ratio_vs_" in k and r["provider"] != "fastenc"}) for r in rows]
        parts += [_md_table(shown, cols), ""]
        skipped = [f"- {m['model']} {p}: {why}" for m in d["models"] for p, why in m["skipped"].items()]
        if skipped:
            parts += ["Not timed:", *skipped, ""]
        if (folder / "models_throughput.png").exists():
            parts += ["![model throughput relative to transformers sdpa](models_throughput.png)", ""]
    if kj.exists():
        d = json.loads(kj.read_text())
        c = d["ceilings"]
        parts += [f"Kernels (`fastenc bench kernels{' --quick' if d['quick'] else ''}`): {_machine_line(d)}. "
                  f"Ceilings measured in the same run: copy {c['copy_bandwidth']['value']:.3g} GB/s, "
                  f"GEMM {c['gemm_rate']['value'] * 1e3:.3g} GFLOP/s.", ""]
        if d.get("note"):
            parts += [f"Note: {d['note']}", ""]
        timed = [r for r in d["rows"] if "median_ms" in r]
        cols = [("op", "op"), ("shape", "shape"), ("provider", "provider"), ("median_ms", "median ms"),
                ("gb_s", "GB/s"), ("tflop_s", "TFLOP/s"), ("frac_of_ceiling", "of ceiling"),
                ("speedup_vs_eager", "x torch eager"), ("speedup_vs_sdpa", "x torch sdpa"),
                ("speedup_vs_compile", "x torch.compile")]
        parts += [_md_table(timed, cols), ""]
        if (folder / "kernels_roofline.png").exists():
            parts += ["![kernel roofline](kernels_roofline.png)", ""]
    parts += [RUNNING]
    return "\n".join(parts)


RUNNING = """### Running the benchmarks

```bash
pip install -e ".[bench]"                      # pytest-benchmark, matplotlib, onnxruntime, onnx, onnxscript
fastenc bench models --quick --out bench/results   # BERT-base, both workloads, vs transformers sdpa and ONNX Runtime
fastenc bench kernels --quick --out bench/results  # one model shape per op, vs torch eager and torch.compile
fastenc bench models --out DIR                 # all four models, + transformers eager and torch.compile
fastenc bench kernels --out DIR                # every model shape and the long-sequence sweep
fastenc bench report --out DIR                 # this page (RESULTS.md) from DIR/models.json and DIR/kernels.json
pytest bench/ --benchmark-only                 # kernels through pytest-benchmark, one group per op
```

On a GPU: `pip install -e ".[bench,gpu]"` (flash-attn; `pip install liger-kernel` adds Liger's norms as a peer), then
`fastenc bench kernels --device cuda --dtype bf16 --out DIR` (adds the cuda and triton backends and the torch SDPA
flash / memory-efficient / cuDNN backends), `fastenc bench models --device cuda --dtype bf16 --out DIR` (ONNX Runtime
is a CPU-only baseline and is skipped there), and `pytest bench/ --benchmark-only --bench-device cuda --bench-dtype bf16`.
GPU times come from CUDA events after warm-up; CPU times from a monotonic clock over repeats. Providers are
interleaved round by round and every row reports the median with the 0.2/0.8 quantiles; the JSON records the
machine, versions and commit. Options: `--threads N`, `--ops`, `--shapes`, `--models`, `--providers`, `--no-compile`.
"""


def print_failures(failed: list[str]) -> None:
    if failed:
        print("\nFAILED (fastenc providers):\n" + "\n".join(f"  {f}" for f in failed))
