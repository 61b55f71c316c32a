"""Where a batch-1 forward's time goes: torch.profiler over a few calls, every op's self time put in one of
GEMM (aten mm/addmm/bmm and the packed oneDNN/MKL linears), fastenc's own ops (fastenc::*, kernel plus the Python
inside the op) and other ops (copies, views, allocation, indexing), and the rest = the profiled wall time minus all
op time: Python between ops, dispatch, input validation; with the number of op events and of tensor allocations a
call makes (counts: they compare host-side work across runs however loaded the machine). The GEMMs found (M x K x N,
with their count) are then timed alone, plain torch.addmm and prepacked oneDNN, to give the machine's GEMM rate at
exactly those shapes: the floor a forward made only of those GEMMs would reach.

Used by `fastenc bench models --breakdown` (a `breakdown` section per latency workload in models.json, printed).
"""
from __future__ import annotations

import statistics
import time
from collections import Counter
from typing import Callable

import torch

from fastenc.benchmark import timing

# profiler names of the allocations (new_empty, empty_like, zeros, ... end in one of these)
ALLOC_OPS = ("aten::empty", "aten::empty_strided")
# profiler names of the GEMM ops (packed linears by prefix: _linear_pointwise and its .binary overload)
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::baddbmm")
PACKED_GEMM_PREFIXES = ("mkldnn::_linear_pointwise", "mkl::_mkl_linear")
PANEL_GEMM = "fastenc::gemm_packed"  # fastenc.layers.prepack.panel_gemm under the profiler (name + " MxKxN")
INT8_GEMM = "fastenc::int8_linear "  # an int8 layer's GEMM (fastenc.quant.int8.EVENT + " MxKxN")


def _mkn(name: str, shapes: list) -> tuple[int, int, int] | None:
    """(M, K, N) of one GEMM event from its recorded input shapes, or from its name for fastenc's panel GEMM
    ("fastenc::gemm_packed MxKxN", "fastenc::int8_linear MxKxN"); None when they do not say."""
    try:
        if name.startswith((PANEL_GEMM, INT8_GEMM)):
            m, k, n = name.split(" ")[1].split("x")
        elif name == "aten::mm":
            (m, k), (_, n) = shapes[0], shapes[1]
        elif name in ("aten::addmm", "aten::addmm_"):
            (m, k), (_, n) = shapes[1], shapes[2]
        elif name.startswith(PACKED_GEMM_PREFIXES):
            (m, k) = shapes[0]
            w = shapes[2] if len(shapes) > 4 and len(shapes[1]) == 2 and len(shapes[2]) == 2 else shapes[1]
            n = w[0]  # weight (N, K); the .binary overload has (X, other, W, ...)
        else:
            return None
        return int(m), int(k), int(n)
    except (IndexError, TypeError, ValueError):
        return None


def _category(name: str) -> str:
    if name in GEMM_OPS or name.startswith(PACKED_GEMM_PREFIXES) or name.startswith((PANEL_GEMM, INT8_GEMM)):
        return "gemm"
    return "fastenc_ops" if name.startswith("fastenc::") else "other_ops"


def breakdown(call: Callable[[], object], calls: int = 5) -> dict:
    """Profile `calls` runs of `call` (after one untimed): per-call ms by category, the rest, the GEMM shapes."""
    from torch.profiler import ProfilerActivity, profile

    call()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        wall_ms = (time.perf_counter() - t0) * 1e3 / calls
    us = Counter()
    shapes: Counter = Counter()
    n_ops = n_alloc = 0
    for e in prof.events():
        n_ops += 1
        n_alloc += e.name in ALLOC_OPS
        cat = _category(e.name)
        us[cat] += e.self_cpu_time_total
        if cat == "gemm":
            mkn = _mkn(e.name, e.input_shapes)
            if mkn is not None:
                shapes[mkn] += 1
    # op events (every aten/fastenc/oneDNN op, nested ones included) and tensor allocations per call: counts, so
    # they compare host-side work across runs whatever the machine's load
    out = {"profiled_wall_ms": wall_ms, "ops_per_call": n_ops / calls, "allocations_per_call": n_alloc / calls}
    for cat in ("gemm", "fastenc_ops", "other_ops"):
        out[f"{cat}_ms"] = us[cat] / 1e3 / calls
    out["rest_ms"] = wall_ms - sum(out[f"{c}_ms"] for c in ("gemm", "fastenc_ops", "other_ops"))
    out["gemm_shapes"] = {f"{m}x{k}x{n}": c / calls for (m, k, n), c in sorted(shapes.items())}
    out["gemm_gflop"] = sum(2 * m * k * n * c for (m, k, n), c in shapes.items()) / calls / 1e9
    return out


def _gemm_paths(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, o: torch.Tensor,
                paths=("packed", "panels")) -> dict[str, Callable]:
    """The ways to compute x @ w.T + b here, each a call: "plain" (torch.addmm into o), and of `paths` (each packs
    its own copy of w) "packed" (the prepacked oneDNN linear, where torch has oneDNN) and "panels" (fastenc's panel
    GEMM into o, the extension loaded)."""
    from fastenc import extension
    from fastenc.layers import prepack

    fns = {"plain": lambda: torch.addmm(b, x, w.t(), out=o)}
    if "packed" in paths and torch.backends.mkldnn.is_available():
        pw = prepack.PackCache().get(w)[0]
        fns["packed"] = lambda: prepack.linear(x, pw, b)
    if "panels" in paths and extension.loaded():
        pp = prepack.PackCache(panels=True).get(w)[0]
        fns["panels"] = lambda: prepack.panel_gemm(x, pp, w.shape[0], b, o)
    return fns


def gemm_alone(shapes: dict[str, float], rounds: int = 7, cache: dict | None = None) -> dict:
    """Time each 'MxKxN' GEMM alone (fp32, random data): plain torch.addmm into a preallocated output and the
    prepacked oneDNN linear, and (the extension loaded) fastenc's panel GEMM on its panels, interleaved; returns
    the sum over shapes of count x median for each, in ms (a path a shape does not have counts as plain)."""
    cache = {} if cache is None else cache
    total = {"plain": 0.0, "packed": 0.0, "panels": 0.0}
    with torch.no_grad():
        for key, count in shapes.items():
            if key not in cache:
                m, k, n = (int(v) for v in key.split("x"))
                x, w, b, o = torch.randn(m, k), torch.randn(n, k), torch.randn(n), torch.empty(m, n)
                s = timing.interleaved(_gemm_paths(x, w, b, o), "cpu", warmup=2, repeats=rounds)
                cache[key] = {name: statistics.median(v) for name, v in s.items()}
            for name in total:
                total[name] += count * cache[key].get(name, cache[key]["plain"])
    return {f"gemm_alone_{name}_ms": ms for name, ms in total.items()}


def gemm_replay(shapes: dict[str, float], cache: dict) -> Callable[[], None]:
    """A call that runs the GEMMs `shapes` lists ('MxKxN' -> calls per forward), each shape `count` times on the
    path gemm_alone found fastest for it (`cache` as gemm_alone filled it: every shape must be there), bias
    included, on random fp32 data made here, a weight of its own per call (as each layer has: one weight reused
    would stay in cache): the forward's GEMMs and nothing else, to time beside the forward."""
    steps = []
    for key, count in shapes.items():
        m, k, n = (int(v) for v in key.split("x"))
        times = cache[key]
        path = min(times, key=times.get)
        x, b, o = torch.randn(m, k), torch.randn(n), torch.empty(m, n)
        for _ in range(max(1, round(count))):
            fns = _gemm_paths(x, torch.randn(n, k), b, o, paths=(path,))
            steps.append(fns.get(path, fns["plain"]))

    def run() -> None:
        with torch.no_grad():
            for fn in steps:
                fn()

    return run


def gemm_floor(b: dict) -> float:
    """The GEMM floor of a profiled call from its breakdown `b` (breakdown + gemm_alone): the least time its GEMMs
    were seen to take, timed alone on any path or inside the call itself. Both are measurements of the same GEMMs,
    so the smaller is the better bound: a slow stretch of the machine while they were timed alone would otherwise
    put the floor above the call that contains them."""
    return min(b["gemm_ms"], *(b[f"gemm_alone_{k}_ms"] for k in ("plain", "packed", "panels")))


def format_breakdown(model: str, workload: str, provider: str, b: dict, wall_p50_ms: float | None) -> str:
    """One line: wall p50, then each category's ms and share of the profiled wall, GEMM rate vs alone."""
    w = b["profiled_wall_ms"]
    parts = [f"{c.replace('_ms', '')} {b[c]:.2f} ms ({100 * b[c] / w:.0f}%)"
             for c in ("gemm_ms", "fastenc_ops_ms", "other_ops_ms", "rest_ms")]
    alone = min(b.get(f"gemm_alone_{name}_ms", float("inf")) for name in ("plain", "packed", "panels"))
    rate = f"; GEMMs {b['gemm_gflop'] / b['gemm_ms'] * 1e3:.0f} GFLOP/s in the forward" if b["gemm_ms"] else ""
    if alone != float("inf") and b["gemm_ms"]:
        rate += f", {b['gemm_gflop'] / alone * 1e3:.0f} alone (best of plain/packed/panels: {alone:.2f} ms)"
    p50 = f"p50 {wall_p50_ms:.2f} ms, " if wall_p50_ms is not None else ""
    counts = (f"; {b['ops_per_call']:.0f} ops, {b['allocations_per_call']:.0f} allocations a call"
              if "ops_per_call" in b else "")
    return f"  {model} {workload} {provider}: {p50}profiled {w:.2f} ms = " + ", ".join(parts) + rate + counts
