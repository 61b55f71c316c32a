"""Training benchmarks (`fastenc bench kernels --backward`): forward + backward of every op whose benchmark spec
declares a backward case (fastenc/benchmark/ops/<op>.py) through fastenc (the backend automatic selection picks on
the device) beside torch eager autograd of the same math and torch.compile of that math, and for attention torch
SDPA on the padded batch, timed interleaved in one process.

Each row carries the op's forward + backward bytes (elementwise ops and norms: their floor is moving them once at
the copy bandwidth measured in the same run) or FLOPs (attention, lora_linear: the fraction of the measured GEMM
rate), as each spec models them, the paired ratios baseline / fastenc per round (median and the 20-80% spread),
and the largest gradient difference between fastenc and eager autograd relative to the gradient's size.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import torch

from fastenc import registry
from fastenc.benchmark import ceilings, report, timing
from fastenc.benchmark import ops as op_specs
from fastenc.benchmark.ops._common import BwdCase, BwdInputs
from fastenc.benchmark.options import UsageError

def backward_cases(quick: bool = False) -> list[BwdCase]:
    """Every spec's backward case: BERT-base / ModernBERT-base training shapes (8 x 128 tokens; attention: the varlen
    workload); quick: a few tokens, for a smoke run."""
    return [s.backward_case(quick) for s in op_specs.backward_specs().values()]


def _step(fn: Callable[[], object], leaves: list[torch.Tensor], grads: list[torch.Tensor]) -> Callable[[], None]:
    def call():
        for t in leaves:
            t.grad = None
        out = fn()
        outs = list(out) if isinstance(out, tuple) else [out]
        torch.autograd.backward(outs, grads)
    return call


def _grad_error(bench: BwdInputs, run_eager: Callable[[], None], fastenc_grads: list[torch.Tensor]) -> float:
    """max |fastenc grad - eager grad| / max |eager grad| over the inputs that get gradients."""
    _step(bench.fastenc, bench.leaves, fastenc_grads)()
    run_eager()
    worst = 0.0
    for ours, theirs in zip(bench.leaves, bench.eager_leaves):
        ref = theirs.grad if bench.unpad is None else bench.unpad(theirs.grad)
        scale = float(ref.abs().max()) or 1.0
        worst = max(worst, float((ours.grad.float() - ref.float()).abs().max()) / scale)
    return worst


def _paired(samples: dict[str, list[float]], base: str, ours: str = "fastenc") -> dict:
    """Per-round ratios base / ours (> 1: fastenc faster): median and the 20% / 80% quantiles."""
    ratios = [b / o for b, o in zip(samples[base], samples[ours]) if o > 0]
    return {"median": timing.percentile(ratios, 0.5), "q20": timing.percentile(ratios, 0.2),
            "q80": timing.percentile(ratios, 0.8), "rounds": len(ratios)}


def run_case(case: BwdCase, device: str, dtype: torch.dtype, ceil: dict, *, repeats: int = 7,
             compile_ref: bool = True, min_time_s: float = 1.0) -> dict:
    """Time fastenc, eager autograd, torch.compile and (attention) SDPA fwd + bwd; one result row."""
    bench = op_specs.spec(case.op).backward_setup(case, device, dtype)
    fastenc_grads = bench.grads if bench.unpad is None else [bench.unpad(bench.grads[0]).contiguous()]
    providers = {"fastenc": _step(bench.fastenc, bench.leaves, fastenc_grads)}
    base = op_specs.backward_baseline(case.op)
    providers[base] = _step(lambda: bench.eager(*bench.args), bench.eager_leaves, bench.grads)
    row = {"op": case.op, "shape": case.shape, "device": device, "dtype": str(dtype).replace("torch.", ""),
           "backend": _backend(case.op, bench), "grad_rel_err": _grad_error(bench, providers[base], fastenc_grads)}
    if compile_ref:
        compiled = torch.compile(bench.eager)
        providers["torch-compile"] = _step(lambda: compiled(*bench.args), bench.eager_leaves, bench.grads)
        print(f"  compiling the {case.op} baseline ...", file=sys.stderr, flush=True)
        providers["torch-compile"]()
    samples = timing.interleaved(providers, device, warmup=2, repeats=repeats, min_time_s=min_time_s,
                                 max_repeats=4 * repeats)
    for name, v in samples.items():
        st = timing.summarize(v)
        row[f"{name}_ms"], row[f"{name}_min_ms"] = st.median_ms, st.min_ms
    for name in samples:
        if name != "fastenc":
            row[f"{name}_over_fastenc"] = _paired(samples, name)
    ms = row["fastenc_ms"]
    if bench.nbytes:
        gbs = ceil["copy_bandwidth"]["value"]
        row.update(bytes=bench.nbytes, gb_per_s=bench.nbytes / (ms / 1e3) / 1e9,
                   floor_ms=bench.nbytes / (gbs * 1e9) * 1e3)
        row["fraction_of_copy_bandwidth"] = row["floor_ms"] / ms
    if bench.flops:
        rate = ceil["gemm_rate"]["value"]
        row.update(flops=bench.flops, tflops=bench.flops / (ms / 1e3) / 1e12)
        row["fraction_of_gemm_rate"] = row["tflops"] / rate
    row["target"] = op_specs.backward_target(case.op)
    return row


def _backend(op: str, bench: BwdInputs) -> str:
    """The backend automatic selection picks for this case's forward (asked the same way the op asks)."""
    try:
        return registry.select(op, op_specs.backward_select(op, bench)).backend
    except ValueError as e:
        return f"? ({e})"


def bench_backward(device: str, dtype: torch.dtype, *, quick: bool, out: Path, ops=None, compile_ref: bool = True,
                   note: str | None = None) -> dict:
    """Run every backward case (or `ops`), print a table, write backward.json into `out`."""
    cases = backward_cases(quick)
    if ops:
        unknown = sorted(set(ops) - {c.op for c in cases})
        if unknown:
            raise UsageError(f"--ops: no backward benchmark for {unknown}; known: {sorted({c.op for c in cases})}")
        cases = [c for c in cases if c.op in ops]
    meta = report.metadata(device, dtype, quick)
    ceil = ceilings.measure(device, dtype, quick)
    rows = []
    for i, case in enumerate(cases):
        print(f"[{i + 1}/{len(cases)}] {case.op} {case.shape}", file=sys.stderr, flush=True)
        rows.append(run_case(case, device, dtype, ceil, repeats=3 if quick else 9, compile_ref=compile_ref,
                             min_time_s=0.0 if quick else 1.0))
    print(table(rows))
    out.mkdir(parents=True, exist_ok=True)
    payload = {"meta": meta, "note": note, "ceilings": ceil, "rows": rows}
    path = report.write_json(out / "backward.json", payload)
    return {"rows": rows, "files": [path], "failures": []}


def table(rows: list[dict]) -> str:
    flat = []
    for r in rows:
        f = {k: v for k, v in r.items() if not isinstance(v, dict)}
        for k, v in r.items():
            if isinstance(v, dict):
                f[k] = f"{v['median']:.2f} [{v['q20']:.2f}, {v['q80']:.2f}]"
        flat.append(f)
    cols = [("op", "op"), ("backend", "backend"), ("fastenc_ms", "fastenc ms"), ("torch-eager_over_fastenc", "eager/ours"),
            ("sdpa_over_fastenc", "sdpa/ours"), ("torch-compile_over_fastenc", "compile/ours"),
            ("fraction_of_copy_bandwidth", "of copy bw"), ("fraction_of_gemm_rate", "of GEMM"),
            ("grad_rel_err", "grad err")]
    return report.table(flat, [c for c in cols if any(c[0] in r for r in flat)])
