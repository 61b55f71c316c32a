"""`fastenc bench models`: every model of fastenc.benchmark.models (one fresh process each when several run) with a
progress bar, the throughput and batch-1 latency tables, and JSON + CSV + PNG plots in the output folder."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from fastenc.benchmark import isolated, latency, options, report
from fastenc.benchmark import models as _models
from fastenc.benchmark.options import UsageError

COMMAND = "models"
HELP = "encoders of every architecture vs transformers eager/sdpa/compile and ONNX Runtime"


def add_arguments(p) -> None:
    options.models(p, "comma-separated names of fastenc.benchmark.models.MODELS (bert-base, modernbert-base, "
                   "vit-b16, deit-base, distilbert-base, ..., minilm)")
    options.same_process(p)
    options.providers(p, "comma-separated providers to keep: fastenc,hf-eager,hf-sdpa,hf-compile,onnxruntime")
    options.breakdown(p, "where fastenc's and transformers sdpa's batch-1 time goes (GEMM vs the same GEMMs alone, "
                      "fastenc's ops, other ops, Python/dispatch), under torch.profiler")
    options.workloads(p, "comma-separated of fixed, varlen, latency (default: all; batch-1 latency always runs)")
    options.no_compile(p)
    options.no_plots(p)


def command(args, device: str, dtype: torch.dtype, out: Path) -> dict:
    return bench_models(device, dtype, quick=args.quick, out=out, models=options.split(args.models),
                        providers=options.split(args.providers), compile_hf=not args.no_compile,
                        plots=not args.no_plots, note=args.note, isolate=False if args.same_process else None,
                        breakdown=args.breakdown, workloads=options.split(args.workloads), rounds=args.rounds)


def _log(msg: str) -> None:
    tqdm.write(msg, file=sys.stderr)


def _run_model_isolated(name, device, dtype, wanted, quick, threads, log, tick, step, breakdown=False,
                        only=None, rounds=None) -> dict:
    """run_model in a fresh Python process (fastenc.benchmark.isolated), so a model's timing never depends on what
    an earlier model left behind in this one: after larger allocations glibc's adaptive mmap/trim thresholds let
    transformers stop faulting its activations in, and buffers, thread pools or ONNX Runtime sessions linger."""
    spec = {"entry": "fastenc.benchmark.models:run_isolated", "model": name, "device": str(device), "dtype": str(dtype).replace("torch.", ""),
            "providers": list(wanted), "quick": bool(quick), "threads": int(threads), "breakdown": bool(breakdown),
            "only": only, "rounds": rounds}
    return isolated.run(spec, log, tick, step)


def _run_model_here(name, device, dtype, wanted, quick, threads, log, tick, step, breakdown=False,
                    only=None, rounds=None) -> dict:
    return _models.run_model(_models.MODELS[name], device, dtype, wanted, quick=quick, threads=threads, log=log,
                             tick=tick, step=step, breakdown=breakdown, only=only, rounds=rounds)


def bench_models(device: str, dtype: torch.dtype, *, quick: bool, out: Path, models=None, providers=None,
                 compile_hf: bool = True, plots: bool = True, note: str | None = None,
                 isolate: bool | None = None, breakdown: bool = False, workloads: list[str] | None = None,
                 rounds: int | None = None) -> dict:
    """isolate: each model in its own process (default when more than one model runs); breakdown: where the
    batch-1 time of fastenc and transformers sdpa goes (fastenc.benchmark.latency); workloads: the throughput
    workloads to run (fixed, varlen; default both; the batch-1 latency always runs)."""
    bad = sorted(set(workloads or ()) - {"fixed", "varlen", "latency"})
    if bad:
        raise UsageError(f"--workloads: unknown {bad}; known: fixed, varlen, latency")
    names = models or (["bert-base"] if quick else list(_models.MODELS))
    unknown = [n for n in names if n not in _models.MODELS]
    if unknown:
        raise UsageError(f"--models: unknown {unknown}; known: {list(_models.MODELS)}")
    if providers:
        wanted = providers
    elif quick:
        wanted = ["fastenc", "hf-sdpa", "onnxruntime"]
    else:
        wanted = ["fastenc", "hf-eager", "hf-sdpa"] + (["hf-compile"] if compile_hf else []) + ["onnxruntime"]
    threads = torch.get_num_threads()
    meta = report.metadata(device, dtype, quick)
    meta["note"] = note
    meta["threads"] = threads
    meta["workloads"] = {"fixed": "8 x 128 tokens (ViT: 8 images 224x224)",
                         "varlen": "16 sequences, lengths uniform in [16, 384], torch.Generator().manual_seed(0); "
                                   "baselines run the batch padded to its longest sequence; tokens/s counts real tokens",
                         "latency": "batch 1: 1 x 128 tokens (ViT: 1 image), p50/p95",
                         "latency-1x16": "batch 1: 1 x 16 tokens, p50/p95"}
    isolate = len(names) > 1 if isolate is None else isolate
    meta["process_per_model"] = isolate
    t0 = time.perf_counter()
    results = []
    steps = ["build", "check outputs", "batch-1 latency"] + [f"{w} workload" for w in ("fixed", "varlen")
                                                             if workloads is None or w in workloads]
    bar = tqdm(total=len(names) * len(steps), desc="models", unit="step", file=sys.stderr, dynamic_ncols=True)
    for n in names:
        done = [0]

        def step(msg, n=n, done=done):
            if done[0]:
                bar.update(1)
            done[0] += 1
            bar.set_postfix_str(f"{n}: {msg}")

        run = _run_model_isolated if isolate else _run_model_here
        results.append(run(n, device, dtype, wanted, quick, threads, log=_log, tick=bar.refresh, step=step,
                           breakdown=breakdown, only=workloads, rounds=rounds))
        bar.update(len(steps) - done[0] + 1)
    bar.close()
    rows = [r for res in results for r in res["rows"]]
    lat_rows = [r for res in results for r in res.get("latency_rows", [])]
    meta["elapsed_s"] = time.perf_counter() - t0
    failed = [f"{res['model']} {p}: {why}" for res in results for p, why in res.get("failed", {}).items()]
    payload = {"suite": "models", **meta, "providers": wanted, "models": results, "rows": rows,
               "latency_rows": lat_rows, "failures": failed}
    out.mkdir(parents=True, exist_ok=True)
    files = [report.write_json(out / "models.json", payload), report.write_csv(out / "models.csv", rows),
             report.write_csv(out / "models_latency.csv", lat_rows)]
    if plots and rows:
        files += _model_plots(out, rows, meta)
    print(model_table(results))
    print(latency_table(results))
    report.print_failures(failed)
    return {"payload": payload, "files": [f for f in files if f], "failures": failed}


def _spread(row: dict, base: str) -> str:
    """', 20-80% a-b' for a throughput row's paired ratio to `base`, or '' when the row has no spread."""
    q = row.get(f"paired_ratio_vs_{base}_q20_q80")
    return f", 20-80% {q[0]:.2f}-{q[1]:.2f}" if q else ""


def model_table(results: list[dict]) -> str:
    rows = [r for res in results for r in res["rows"]]
    cols = [("model", "model"), ("workload", "workload"), ("provider", "provider"), ("throughput", "units/s"),
            ("median_ms", "median ms"), ("latency_p50_ms", "b1 p50 ms"), ("latency_p95_ms", "b1 p95 ms"),
            ("peak_mem_mib", "peak MiB"), ("max_abs_err_vs_transformers", "max err")]
    cols += [(f"ratio_vs_{b}", f"x {b}") for b in _models.BASELINES if any(f"ratio_vs_{b}" in r for r in rows)]
    cols += [(f"paired_ratio_vs_{b}", f"paired x {b}") for b in _models.BASELINES
             if any(f"paired_ratio_vs_{b}" in r for r in rows)]
    text = report.table(rows, cols)
    notes = [f"  {res['model']} {p}: {why}" for res in results for p, why in res["skipped"].items()]
    if notes:
        text += "\n\nnot timed:\n" + "\n".join(notes)
    lines = []
    for r in rows:
        if r["provider"] == "fastenc":
            parts = [f"{r[f'ratio_vs_{b}']:.2f}x {b} (paired {r[f'paired_ratio_vs_{b}']:.2f}x{_spread(r, b)})"
                     for b in ("hf-sdpa", "onnxruntime", "hf-eager", "hf-compile")
                     if f"ratio_vs_{b}" in r and r[f"ratio_vs_{b}"] is not None]
            if parts:
                lines.append(f"  {r['model']} {r['workload']}: fastenc = " + ", ".join(parts))
    if lines:
        text += "\n\nfastenc throughput ratios (higher is better):\n" + "\n".join(lines)
    return text


def latency_table(results: list[dict]) -> str:
    """Batch-1 p50/p95 per model x shape x provider, fastenc's time ratios (paired, with spread), breakdowns."""
    rows = [r for res in results for r in res.get("latency_rows", [])]
    if not rows:
        return ""
    cols = [("model", "model"), ("workload", "workload"), ("provider", "provider"), ("p50_ms", "p50 ms"),
            ("p95_ms", "p95 ms"), ("n", "n")]
    text = "\nbatch-1 latency:\n" + report.table(rows, cols)
    lines = []
    for r in rows:
        if r["provider"] != "fastenc":
            continue
        parts = [f"{r[f'time_ratio_vs_{b}']:.2f}x {b} (paired {r[f'paired_time_ratio_vs_{b}']:.2f}x, 20-80% "
                 f"{r[f'paired_time_ratio_vs_{b}_q20_q80'][0]:.2f}-{r[f'paired_time_ratio_vs_{b}_q20_q80'][1]:.2f})"
                 for b in _models.BASELINES if f"time_ratio_vs_{b}" in r]
        if parts:
            lines.append(f"  {r['model']} {r['workload']}: fastenc time = " + ", ".join(parts))
    if lines:
        text += "\n\nfastenc batch-1 time over the baseline's (lower is better):\n" + "\n".join(lines)
    parts = [latency.format_breakdown(res["model"], w, p, b, b.get("p50_ms"))
             for res in results for w, by in (res.get("breakdown") or {}).items() for p, b in by.items()]
    if parts:
        text += ("\n\nwhere batch-1 time goes (per forward, under torch.profiler; rest = Python, dispatch, "
                 "validation):\n" + "\n".join(parts))
    return text


def _model_plots(out: Path, rows: list[dict], meta: dict) -> list:
    groups = list(dict.fromkeys(f"{r['model']}\n{r['workload']}" for r in rows))
    provs = list(dict.fromkeys(r["provider"] for r in rows))
    # normalize to hf-sdpa so text (tokens/s) and vision (images/s) share one axis
    base = {f"{r['model']}\n{r['workload']}": r["throughput"] for r in rows if r["provider"] == "hf-sdpa"}
    vals = {}
    for r in rows:
        g = f"{r['model']}\n{r['workload']}"
        vals[(g, r["provider"])] = r["throughput"] / base[g] if g in base else r["throughput"]
    ylabel = "throughput relative to transformers sdpa" if base else "throughput (units/s)"
    where = meta["machine"]["cpu"] if meta["device"] == "cpu" else meta["machine"].get("gpu", meta["device"])
    return [report.plot_bars(out / "models_throughput.png", groups, provs, vals, ylabel,
                             f"encoder throughput ({where}, {meta['machine']['threads']} threads, {meta['dtype']})")]
