"""`fastenc bench models [--quantize int8]`: every model of fastenc.benchmark.models (one fresh process each when
several run) with a progress bar, the throughput and batch-1 latency tables, and JSON + CSV + PNG plots."""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
from tqdm import tqdm

from fastenc.benchmark import (int8_accuracy, int8_models, int8_report, isolated, latency, model_workloads, options,
                               report)
from fastenc.benchmark import models as _models
from fastenc.benchmark.options import UsageError

COMMAND = "models"
HELP = "encoders of every architecture vs transformers eager/sdpa/compile and ONNX Runtime"


def add_arguments(p) -> None:
    options.models(p, "comma-separated names of fastenc.benchmark.models.MODELS (bert-base, modernbert-base, "
                   "vit-b16, deit-base, distilbert-base, ..., minilm)")
    options.same_process(p)
    options.providers(p, "comma-separated providers to keep: fastenc,hf-eager,hf-sdpa,hf-compile,onnxruntime; with "
                      "--quantize int8: fastenc,fastenc-int8,hf-sdpa and the int8 peers (onnxruntime-fp32, "
                      "onnxruntime-int8, torch-dynamic-int8, ctranslate2-int8, ctranslate2-int8_float32, openvino-int8)")
    options.breakdown(p, "where fastenc's and transformers sdpa's batch-1 time goes (GEMM vs the same GEMMs alone, "
                      "fastenc's ops, other ops, Python/dispatch), under torch.profiler")
    options.workloads(p, "comma-separated of fixed, varlen, captions, long-2k, long, latency (default: each "
                      "model's: fixed and varlen where they fit its positions, captions for the short-text towers "
                      "(< 128 positions), long (one 8,192-token text) where it fits, not with --quick; long-2k (one "
                      "2,048-token text) only when asked; batch-1 latency always runs)")
    options.no_compile(p)
    options.no_plots(p)
    options.quantize(p, "int8: time int8 inference side by side (fastenc fp32, the ratios' baseline, and "
                     "fastenc.quantize'd; transformers sdpa; ONNX Runtime fp32 and int8, torch dynamic int8, "
                     "CTranslate2 int8, OpenVINO int8) and measure each provider's accuracy against fp32 transformers")
    options.passages(p, "with --quantize: docstring passages the accuracy is measured on (default 2000, --quick 200)")


def command(args, device: str, dtype: torch.dtype, out: Path) -> dict:
    return bench_models(device, dtype, quick=args.quick, out=out, models=options.split(args.models),
                        providers=options.split(args.providers), compile_hf=not args.no_compile,
                        plots=not args.no_plots, note=args.note, isolate=False if args.same_process else None,
                        breakdown=args.breakdown, workloads=options.split(args.workloads), rounds=args.rounds,
                        quantize=args.quantize, passages=args.passages)


def _log(msg: str) -> None:
    tqdm.write(msg, file=sys.stderr)


def _run_model_isolated(name, device, dtype, wanted, quick, threads, log, tick, step, breakdown=False,
                        only=None, rounds=None, quantize=None, texts=None) -> dict:
    """run_model in a fresh Python process (fastenc.benchmark.isolated), so a model's timing never depends on what
    an earlier model left behind in this one: after larger allocations glibc's adaptive mmap/trim thresholds let
    transformers stop faulting its activations in, and buffers, thread pools or ONNX Runtime sessions linger.
    The accuracy passages (`texts`) go to it in a temporary JSON file."""
    spec = {"entry": "fastenc.benchmark.models:run_isolated", "model": name, "device": str(device), "dtype": str(dtype).replace("torch.", ""),
            "providers": list(wanted), "quick": bool(quick), "threads": int(threads), "breakdown": bool(breakdown),
            "only": only, "rounds": rounds, "quantize": quantize}
    if texts is None:
        return isolated.run(spec, log, tick, step)
    fd, path = tempfile.mkstemp(prefix="fastenc-passages-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(texts, f)
        return isolated.run({**spec, "texts_file": path}, log, tick, step)
    finally:
        os.unlink(path)


def _run_model_here(name, device, dtype, wanted, quick, threads, log, tick, step, breakdown=False,
                    only=None, rounds=None, quantize=None, texts=None) -> dict:
    return _models.run_model(_models.MODELS[name], device, dtype, wanted, quick=quick, threads=threads, log=log,
                             tick=tick, step=step, breakdown=breakdown, only=only, rounds=rounds, quantize=quantize,
                             texts=texts)


def _check_int8(quantize, passages, device, dtype, providers) -> None:
    """Refuse a bad --quantize / --passages / --providers combination before any work, naming the option."""
    if quantize is None:
        if passages is not None:
            raise UsageError("--passages: sets the accuracy passages of --quantize int8; add --quantize int8")
        int8_only = [p for p in providers or () if p in int8_models.KNOWN and p not in _models.BASELINES + ("fastenc",)]
        if int8_only:
            raise UsageError(f"--providers: {int8_only} run with --quantize int8 only")
        return
    if quantize not in int8_models.MODES:
        raise UsageError(f"--quantize: expected one of {', '.join(int8_models.MODES)}, got {quantize!r}")
    if str(device) != "cpu" or dtype != torch.float32:
        raise UsageError(f"--quantize {quantize}: int8 inference runs on the CPU in fp32; got --device {device} "
                         f"--dtype {str(dtype).replace('torch.', '')}")
    unknown = [p for p in providers or () if p not in int8_models.KNOWN]
    if unknown:
        raise UsageError(f"--providers: unknown with --quantize {quantize}: {unknown}; known: "
                         f"{', '.join(int8_models.KNOWN)}")


def bench_models(device: str, dtype: torch.dtype, *, quick: bool, out: Path, models=None, providers=None,
                 compile_hf: bool = True, plots: bool = True, note: str | None = None,
                 isolate: bool | None = None, breakdown: bool = False, workloads: list[str] | None = None,
                 rounds: int | None = None, quantize: str | None = None, passages: int | None = None) -> dict:
    """isolate: each model in its own process (default when more than one model runs); breakdown: where the
    batch-1 time of fastenc and transformers sdpa goes (fastenc.benchmark.latency); workloads: the throughput
    workloads to run (fixed, varlen, captions, long-2k, long; default: each model's, fastenc.benchmark.models.workloads;
    the batch-1 latency always runs). quantize "int8": the int8
    providers (int8_models.PROVIDERS unless `providers`), ratios against fastenc fp32 and the best int8 peer, and
    each provider's accuracy on `passages` docstring passages (default 2000, quick 200)."""
    known = model_workloads.THROUGHPUT + ("latency",)
    bad = sorted(set(workloads or ()) - set(known))
    if bad:
        raise UsageError(f"--workloads: unknown {bad}; known: {', '.join(known)}")
    _check_int8(quantize, passages, device, dtype, providers)
    names = models or (["bert-base"] if quick else list(_models.MODELS))
    unknown = [n for n in names if n not in _models.MODELS]
    if unknown:
        raise UsageError(f"--models: unknown {unknown}; known: {list(_models.MODELS)}")
    if providers:
        wanted = providers
    elif quantize:
        wanted = list(int8_models.PROVIDERS)
    elif quick:
        wanted = ["fastenc", "hf-sdpa", "onnxruntime"]
    else:
        wanted = ["fastenc", "hf-eager", "hf-sdpa"] + (["hf-compile"] if compile_hf else []) + ["onnxruntime"]
    threads = torch.get_num_threads()
    meta = report.metadata(device, dtype, quick)
    meta["note"] = note
    meta["threads"] = threads
    meta["workloads"] = {"fixed": "8 x 128 tokens (vision: 8 images at the model's image size)",
                         "varlen": "16 sequences, lengths uniform in [16, 384], torch.Generator().manual_seed(0); "
                                   "baselines run the batch padded to its longest sequence; tokens/s counts real tokens",
                         "captions": "{} texts, lengths uniform in [{}, {}] (at most the model's positions), seed 0; "
                                     "the short-text towers (CLIP / SigLIP text) by default".format(*model_workloads.CAPTIONS),
                         "long-2k": f"one {model_workloads.LONG_2K_TOKENS}-token text, asked for with --workloads",
                         "long": f"one {model_workloads.LONG_TOKENS}-token text, for the models that accept that many "
                                 "positions (not by default with --quick)",
                         "latency": "batch 1: 1 x 128 tokens (fewer positions: 1 x positions; vision: 1 image), p50/p95",
                         "latency-1x16": "batch 1: 1 x 16 tokens, p50/p95"}
    isolate = len(names) > 1 if isolate is None else isolate
    meta["process_per_model"] = isolate
    t0 = time.perf_counter()
    results = []
    steps = ["build", "check outputs", "batch-1 latency"] + [f"{w} workload" for w in model_workloads.THROUGHPUT[:2]
                                                             if workloads is None or w in workloads]
    texts = None
    if quantize:
        steps.append("accuracy")
        texts = _int8_meta(meta, quantize, wanted, quick, passages, names)
    bar = tqdm(total=len(names) * len(steps), desc="models", unit="step", file=sys.stderr, dynamic_ncols=True)
    for n in names:
        done = [0]

        def step(msg, n=n, done=done):
            if done[0]:
                bar.update(1)
            done[0] += 1
            bar.set_postfix_str(f"{n}: {msg}")

        run = _run_model_isolated if isolate else _run_model_here
        try:
            results.append(run(n, device, dtype, wanted, quick, threads, log=_log, tick=bar.refresh, step=step,
                               breakdown=breakdown, only=workloads, rounds=rounds, quantize=quantize,
                               texts=texts if _models.MODELS[n].kind == "text" else None))
        except isolated.ChildFailed as e:  # (killed, e.g. out of memory: the other models still run)
            if not e.killed:
                raise
            _log(f"{e}; going on with the next model")
            results.append({"model": n, "rows": [], "latency_rows": [], "breakdown": {}, "skipped": {},
                            "errors": {}, "failed": {"process": str(e)}, "provider_info": {},
                            "workloads_not_run": {}})
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
        files += _model_plots(out, rows, meta, "fastenc" if quantize else "hf-sdpa")
    if quantize:
        print(int8_report.throughput_table(results))
        print(int8_report.latency_table(results))
        print(int8_report.accuracy_table(results))
    else:
        print(model_table(results))
        print(latency_table(results))
    report.print_failures(failed)
    return {"payload": payload, "files": [f for f in files if f], "failures": failed}


def _int8_meta(meta: dict, quantize: str, wanted: list[str], quick: bool, passages: int | None,
               names: list[str]) -> list[str] | None:
    """Fill the int8 mode's part of the results' metadata; returns the accuracy passages (None: no text model)."""
    meta["quantize"] = quantize
    meta["machine"].update(int8_models.machine())
    meta["baselines"] = list(int8_models.BASELINES) + [int8_report.BEST]
    meta["int8_peers"] = list(int8_models.PEERS)
    meta["providers_described"] = {p: int8_models.describe(p) for p in wanted}
    meta["not_run"] = {p: why for p, why in int8_models.NOT_RUN.items() if p not in wanted}
    meta["ratios"] = ("ratio_vs_<b>: throughput over b's (of the medians; paired_: the median of the per-round "
                      f"ratios); b = fastenc (fp32), hf-sdpa, onnxruntime-fp32 and {int8_report.BEST}, the int8 peer "
                      "with the highest throughput in that workload (named in the row's best_int8_peer); batch-1 "
                      "rows: time_ratio_vs_<b>, the time over b's")
    texts = None
    if any(_models.MODELS[n].kind == "text" for n in names):
        n = passages or int8_models.PASSAGES["quick" if quick else "full"]
        texts, meta["accuracy_passages"] = int8_accuracy.passages(n)
    return texts


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
    notes += [f"  {res['model']} {w} workload: {why}" for res in results
              for w, why in res.get("workloads_not_run", {}).items()]
    if notes:
        text += "\n\nnot timed:\n" + "\n".join(notes)
    ort = [(res["model"], res.get("provider_info", {}).get("onnxruntime")) for res in results]
    ort = [f"  {m}: {o['export']} export" + (f", fused {o['fused']}" if o.get("fused") is not None else "")
           for m, o in ort if o]
    if ort:
        text += "\n\nONNX Runtime baseline:\n" + "\n".join(ort)
    lines = []
    for r in rows:
        if r["provider"] == "fastenc":
            parts = [f"{r[f'ratio_vs_{b}']:.2f}x {b} (paired {r[f'paired_ratio_vs_{b}']:.2f}x{_spread(r, b)})"
                     for b in ("hf-sdpa", "onnxruntime", "hf-eager", "hf-compile")
                     if f"ratio_vs_{b}" in r and r[f"ratio_vs_{b}"] is not None]
            ceil = [f"{r[f'paired_ceiling_vs_{b}']:.2f}x {b}" for b in ("hf-sdpa", "hf-eager")
                    if f"paired_ceiling_vs_{b}" in r]
            if ceil:
                parts.append(f"time {r['paired_time_over_gemms_alone']:.2f}x its GEMMs' alone (same rounds: a "
                             "ceiling of " + ", ".join(ceil) + ")")
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


def _model_plots(out: Path, rows: list[dict], meta: dict, against: str = "hf-sdpa") -> list:
    groups = list(dict.fromkeys(f"{r['model']}\n{r['workload']}" for r in rows))
    provs = list(dict.fromkeys(r["provider"] for r in rows))
    # normalize to `against` so text (tokens/s) and vision (images/s) share one axis
    base = {f"{r['model']}\n{r['workload']}": r["throughput"] for r in rows if r["provider"] == against}
    vals = {}
    for r in rows:
        g = f"{r['model']}\n{r['workload']}"
        vals[(g, r["provider"])] = r["throughput"] / base[g] if g in base else r["throughput"]
    ylabel = f"throughput relative to {against}" if base else "throughput (units/s)"
    where = meta["machine"]["cpu"] if meta["device"] == "cpu" else meta["machine"].get("gpu", meta["device"])
    return [report.plot_bars(out / "models_throughput.png", groups, provs, vals, ylabel,
                             f"encoder throughput ({where}, {meta['machine']['threads']} threads, {meta['dtype']})")]
