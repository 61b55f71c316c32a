"""`fastenc bench kernels [--backward]`: every kernel case (fastenc.benchmark.kernels) or forward + backward case
(fastenc.benchmark.backward) with a progress bar, a table, and JSON + CSV + PNG plots in the output folder."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from fastenc.benchmark import backward, ceilings, kernels, options, report

COMMAND = "kernels"
HELP = "every op x backend vs torch eager, torch.compile and peers (--backward: forward + backward)"


def add_arguments(p) -> None:
    p.add_argument("--ops", default=None, help="comma-separated ops to run (default: all)")
    p.add_argument("--shapes", default=None, help="comma-separated substrings of shape names to keep")
    options.providers(p, "comma-separated providers to keep (e.g. cpu,reference,torch-eager,torch-compile)")
    options.no_compile(p)
    options.no_plots(p)
    p.add_argument("--backward", action="store_true",
                   help="forward + backward of every op vs torch eager autograd, torch.compile and SDPA "
                        "(writes backward.json)")


def command(args, device: str, dtype: torch.dtype, out: Path) -> dict:
    if args.backward:
        return backward.bench_backward(device, dtype, quick=args.quick, out=out, ops=options.split(args.ops),
                                       compile_ref=not args.no_compile, note=args.note)
    return bench_kernels(device, dtype, quick=args.quick, out=out, ops=options.split(args.ops),
                         shapes=options.split(args.shapes), providers=options.split(args.providers),
                         compile_ref=not args.no_compile, plots=not args.no_plots, note=args.note)


def _log(msg: str) -> None:
    tqdm.write(msg, file=sys.stderr)


def bench_kernels(device: str, dtype: torch.dtype, *, quick: bool, out: Path, ops=None, shapes=None,
                  providers=None, compile_ref: bool = True, plots: bool = True, note: str | None = None) -> dict:
    cases = kernels.select_cases(quick, ops, shapes)
    if not cases:
        raise kernels.UsageError("no kernel case matches --ops/--shapes")
    meta = report.metadata(device, dtype, quick)
    meta["note"] = note
    t0 = time.perf_counter()
    _log(f"measuring this machine's ceilings on {device} ...")
    ceil = ceilings.measure(device, dtype, quick)
    _log(f"  copy bandwidth {ceil['copy_bandwidth']['value']:.3g} GB/s, "
         f"GEMM {ceil['gemm_rate']['value']:.3g} TFLOP/s ({ceil['gemm_rate']['how']})")
    rows: list[dict] = []
    bar = tqdm(cases, desc="kernels", unit="case", file=sys.stderr, dynamic_ncols=True)
    for case in bar:
        bar.set_postfix_str(f"{case.op} {case.shape}"[:60])
        rows += kernels.run_case(case, device, dtype, ceil, quick=quick, compile_ref=compile_ref,
                                  providers=set(providers) if providers else None)
    bar.close()
    meta["elapsed_s"] = time.perf_counter() - t0
    failed = kernels.failures(rows)
    payload = {"suite": "kernels", **meta, "ceilings": ceil, "rows": rows, "failures": failed}
    out.mkdir(parents=True, exist_ok=True)
    files = [report.write_json(out / "kernels.json", payload), report.write_csv(out / "kernels.csv", rows)]
    if plots:
        files += _kernel_plots(out, rows, ceil, meta)
    print(kernel_table(rows))
    report.print_failures(failed)
    return {"payload": payload, "files": [f for f in files if f], "failures": failed}


def kernel_table(rows: list[dict]) -> str:
    timed = [r for r in rows if "median_ms" in r]
    cols = [("op", "op"), ("shape", "shape"), ("provider", "provider"), ("median_ms", "median ms"),
            ("q20_ms", "q20"), ("q80_ms", "q80"), ("gb_s", "GB/s"), ("tflop_s", "TFLOP/s"),
            ("frac_of_ceiling", "of ceiling"), ("speedup_vs_eager", "x eager"), ("speedup_vs_sdpa", "x sdpa"),
            ("speedup_vs_compile", "x compile"), ("max_abs_err_vs_reference", "max err")]
    text = report.table(timed, cols)
    skipped = [r for r in rows if "skipped" in r]
    if skipped:
        seen = {}
        for r in skipped:
            seen.setdefault((r["op"], r["provider"], r["skipped"]), 0)
        text += "\n\nnot timed:\n" + "\n".join(f"  {op} {p}: {why}" for op, p, why in seen)
    return text


def _kernel_plots(out: Path, rows: list[dict], ceil: dict, meta: dict) -> list:
    timed = [r for r in rows if "median_ms" in r]
    groups = list(dict.fromkeys(f"{r['op']}\n{r['shape']}" for r in timed))
    provs = list(dict.fromkeys(r["provider"] for r in timed))
    vals = {(f"{r['op']}\n{r['shape']}", r["provider"]): r["frac_of_ceiling"] for r in timed}
    where = f"{meta['machine']['cpu'] if meta['device'] == 'cpu' else meta['machine'].get('gpu', meta['device'])}, {meta['dtype']}"
    return [report.plot_bars(out / "kernels_throughput.png", groups, provs, vals,
                             "fraction of measured ceiling\n(copy GB/s or GEMM FLOP/s)",
                             f"fastenc kernels vs baselines ({where})"),
            report.plot_roofline(out / "kernels_roofline.png", timed, ceil, f"kernel roofline ({where})")]


