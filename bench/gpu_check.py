"""Helper of bench/gpu_check.sh: build report, ceilings (copy bandwidth, bf16 GEMM), per-op x backend timings at
BERT-base shapes with CUDA events, and the final JSON + summary table. Self-contained (torch + fastenc only).

  python bench/gpu_check.py build     --out DIR   # build the extension, record meta / cuda availability
  python bench/gpu_check.py measure   --out DIR   # ceilings + op timings -> DIR/measure.json
  python bench/gpu_check.py summarize --out DIR   # steps, tests, timings -> DIR/gpu_check.json + table
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


# ---------------------------------------------------------------- timing
def time_gpu(fn, arg_sets, min_time_s: float = 0.05, max_reps: int = 200) -> dict:
    """Median ms per call of fn(*args), cycling over `arg_sets` (their total bytes exceed L2, so inputs are
    not cache-resident). Calls are queued back to back between two CUDA events, so host overhead hides behind
    the GPU unless the kernel is shorter than the launch; 5 trials, median."""
    import torch

    for a in arg_sets[:2]:
        fn(*a)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn(*arg_sets[0])
    torch.cuda.synchronize()
    est = max(time.perf_counter() - t0, 1e-6)
    reps = int(min(max_reps, max(len(arg_sets), min_time_s / 5 / est)))
    trials = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(reps):
            fn(*arg_sets[i % len(arg_sets)])
        end.record()
        end.synchronize()
        trials.append(start.elapsed_time(end) / reps)
    return {"median_ms": statistics.median(trials), "min_ms": min(trials), "reps": reps}


def ceilings() -> dict:
    import torch

    n = 2**30 // 4  # 1 GiB fp32
    src = torch.rand(n, device="cuda")
    dst = torch.empty_like(src)
    t = time_gpu(lambda: dst.copy_(src), [()], min_time_s=0.1, max_reps=50)
    copy = {"value": 2 * n * 4 / (t["median_ms"] / 1e3) / 1e9, "unit": "GB/s", "how": "1 GiB copy_, read + write"}
    del src, dst
    m = 8192
    a = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(m, m, device="cuda", dtype=torch.bfloat16)
    t = time_gpu(lambda: torch.matmul(a, b, out=c), [()], min_time_s=0.2, max_reps=30)
    gemm = {"value": 2 * m**3 / (t["median_ms"] / 1e3) / 1e12, "unit": "TFLOP/s",
            "how": "bf16 matmul 8192^3 on random data, 2 n^3 FLOPs"}
    torch.cuda.empty_cache()
    return {"copy_bandwidth": copy, "gemm_bf16": gemm}


# ---------------------------------------------------------------- op cases (contract-level calls)
def _visible_pairs(lengths, window) -> int:
    left, right = window
    total = 0
    for n in lengths:
        for i in range(n):
            lo = 0 if left < 0 else max(0, i - left)
            hi = n - 1 if right < 0 else min(n - 1, i + right)
            total += hi - lo + 1
    return total


def op_cases(dtype, dev: str = "cuda"):
    """(op, shape label, make(arg index) -> args for the backend fn, bytes moved or None, flops or None)."""
    import torch

    from fastenc.reference.rope import rope_cache

    T, H, D, hidden, inter = 32 * 512, 12, 64, 768, 3072
    el = torch.tensor([], dtype=dtype).element_size()

    def rnd(*shape, dt=dtype):
        return torch.randn(*shape, device=dev, dtype=dt)

    cases = []
    w, bias = rnd(hidden), rnd(hidden)
    cases.append(("layer_norm", f"{T}x{hidden} +residual", lambda: (rnd(T, hidden), w, bias, rnd(T, hidden), None,
                                                                     1e-5, True), 4 * T * hidden * el, None))
    cases.append(("rms_norm", f"{T}x{hidden} +residual", lambda: (rnd(T, hidden), w, rnd(T, hidden), 1e-6),
                  4 * T * hidden * el, None))
    gb = rnd(inter)
    cases.append(("gelu", f"{T}x{inter} +bias erf", lambda: (rnd(T, inter), gb, "none"), 2 * T * inter * el, None))
    cases.append(("geglu", f"{T}x2*{inter} erf", lambda: (rnd(T, 2 * inter), "none"), 3 * T * inter * el, None))
    cos, sin = rope_cache(D, 512, device=dev)
    pos = torch.arange(512, device=dev, dtype=torch.int32).repeat(32)
    cases.append(("rope", f"{T}x{H}x{D} q+k", lambda: (rnd(T, H, D), rnd(T, H, D), cos, sin, pos),
                  4 * T * H * D * el, None))
    if dtype != torch.float32:
        cu = torch.arange(0, 33 * 512, 512, device=dev, dtype=torch.int32)
        for window, label in (((-1, -1), "global"), ((64, 64), "window 64+64")):
            flops = 4 * _visible_pairs([512] * 32, window) * H * D
            cases.append(("attention", f"32x512 h{H} d{D} {label}",
                          lambda window=window: (rnd(T, H, D), rnd(T, H, D), rnd(T, H, D), cu, 512, window[0],
                                                 window[1], D ** -0.5), None, flops))
        d128 = 128
        flops = 4 * _visible_pairs([1024] * 8, (-1, -1)) * 16 * d128
        cu8 = torch.arange(0, 9 * 1024, 1024, device=dev, dtype=torch.int32)
        cases.append(("attention", "8x1024 h16 d128 global",
                      lambda: (rnd(8192, 16, d128), rnd(8192, 16, d128), rnd(8192, 16, d128), cu8, 1024, -1, -1,
                               d128 ** -0.5), None, flops))
    n_out, n_in, r = 4096, 4096, 16
    cases.append(("merge_lora", f"{n_out}x{n_in} r{r}",
                  lambda: (rnd(n_out, n_in), rnd(r, n_in, dt=torch.float32), rnd(n_out, r, dt=torch.float32), 2.0),
                  2 * n_out * n_in * el, None))
    return cases


ARG_NAMES = {
    "layer_norm": ("x", "weight", "bias", "residual", "input_bias", "eps", "store_residual"),
    "rms_norm": ("x", "weight", "residual", "eps"),
    "gelu": ("x", "bias", "approximate"),
    "geglu": ("x", "approximate"),
    "rope": ("q", "k", "cos", "sin", "positions"),
    "attention": ("q", "k", "v", "cu_seqlens", "max_seqlen", "window_left", "window_right", "scale"),
    "merge_lora": ("weight", "lora_a", "lora_b", "scale"),
}


def _inputs(op: str, args) -> dict:
    """The inputs mapping fastenc.ops hands to registry.select (what each backend's check reads)."""
    d = dict(zip(ARG_NAMES[op], args))
    if op == "attention":
        d["window"] = (d.pop("window_left"), d.pop("window_right"))
    return d


def _nbytes(args) -> int:
    import torch
    return sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def measure(out_dir: Path, dtypes: list[str], budget_s: float) -> dict:
    import torch

    import fastenc  # noqa: F401  (registers every op)
    from fastenc import registry

    t_start = time.perf_counter()
    res = {"ceilings": ceilings(), "timings": [], "errors": []}
    copy_gbs, gemm_tf = res["ceilings"]["copy_bandwidth"]["value"], res["ceilings"]["gemm_bf16"]["value"]
    for dname in dtypes:
        dtype = getattr(torch, DTYPES[dname])
        for op, shape, make, nbytes, flops in op_cases(dtype):
            if time.perf_counter() - t_start > budget_s:
                res["errors"].append(f"time budget of {budget_s:.0f} s reached before {op} {dname} {shape}")
                break
            impls = registry.impls(op)
            first = make()
            copies = max(1, min(8, (256 << 20) // max(_nbytes(first), 1) + 1))  # > L2 in total
            arg_sets = [first] + [make() for _ in range(copies - 1)]
            ref = None
            try:
                ref = _first(impls["reference"].fn(*first)).float()
            except Exception as e:  # noqa: BLE001
                res["errors"].append(f"{op} reference {dname} {shape}: {e}")
            for backend, impl in impls.items():
                if backend == "cpu":
                    continue
                row = {"op": op, "backend": backend, "dtype": dname, "shape": shape}
                reasons = impl.not_supported_reasons(_inputs(op, first))
                if reasons:
                    row["skipped"] = "; ".join(reasons)
                    res["timings"].append(row)
                    continue
                try:
                    out = _first(impl.fn(*first))
                    if ref is not None:
                        row["max_abs_err_vs_reference"] = float((out.float() - ref).abs().max())
                    t = time_gpu(impl.fn, arg_sets)
                except Exception as e:  # noqa: BLE001
                    row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                    res["timings"].append(row)
                    continue
                row.update(t)
                sec = t["median_ms"] / 1e3
                if nbytes:
                    row["GB/s"] = nbytes / sec / 1e9
                    row["frac_copy_bw"] = row["GB/s"] / copy_gbs
                if flops:
                    row["TFLOP/s"] = flops / sec / 1e12
                    row["frac_gemm"] = row["TFLOP/s"] / gemm_tf
                res["timings"].append(row)
            del arg_sets, first, ref
            torch.cuda.empty_cache()
    (out_dir / "measure.json").write_text(json.dumps(res, indent=1))
    return res


# ---------------------------------------------------------------- build
def build(out_dir: Path) -> int:
    from fastenc import extension

    t0 = time.perf_counter()
    info = {"archs": extension.cuda_archs(), "build_dir": str(extension.build_dir())}
    try:
        mod = extension.load_cuda(verbose=False)
        info["built"] = True
        info["has_cuda"] = bool(mod.has_cuda())
    except RuntimeError as e:
        info["built"], info["error"] = False, str(e)
    info["seconds"] = time.perf_counter() - t0
    info["meta"] = extension.meta("cuda")
    info["cuda_backend"] = extension.cuda_available() or "available"
    (out_dir / "build.json").write_text(json.dumps(info, indent=1))
    print(json.dumps(info, indent=1))
    return 0 if info.get("has_cuda") and info["cuda_backend"] == "available" else 3


# ---------------------------------------------------------------- summary
def _junit(path: Path) -> dict | None:
    if not path.exists():
        return None
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:
        return {"error": f"unreadable junit xml: {e}"}
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    tot = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    failed = [f"{c.get('classname')}::{c.get('name')}" for c in root.iter("testcase")
              if c.find("failure") is not None or c.find("error") is not None]
    tot["passed"] = tot["tests"] - tot["failures"] - tot["errors"] - tot["skipped"]
    tot["failed_tests"] = failed[:100]
    return tot


def _machine() -> dict:
    info = {"python": platform.python_version(), "host": platform.node()}
    try:
        import torch
        info.update(torch=torch.__version__, torch_cuda=torch.version.cuda)
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            info.update(gpu=p.name, capability=f"sm_{p.major}{p.minor}", sms=p.multi_processor_count,
                        memory_gib=round(p.total_memory / 2**30, 1))
    except Exception as e:  # noqa: BLE001
        info["torch_error"] = str(e)
    try:
        import triton
        info["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        info["triton"] = None
    try:
        info["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                        timeout=10).stdout.strip() or None
    except Exception:  # noqa: BLE001
        info["commit"] = None
    return info


def summarize(out_dir: Path) -> int:
    steps = []
    if (out_dir / "steps.tsv").exists():
        for line in (out_dir / "steps.tsv").read_text().splitlines():
            name, rc, secs = (line.split("\t") + ["", ""])[:3]
            steps.append({"step": name, "rc": rc, "seconds": int(secs) if secs.isdigit() else None})
    load = lambda name: json.loads((out_dir / name).read_text()) if (out_dir / name).exists() else None  # noqa: E731
    result = {"machine": _machine(), "steps": steps, "build": load("build.json"),
              "op_tests": _junit(out_dir / "ops_junit.xml"), "measure": load("measure.json"),
              "bench_outputs": sorted(str(p.relative_to(out_dir)) for p in out_dir.glob("bench_*/**/*.json"))}
    (out_dir / "gpu_check.json").write_text(json.dumps(result, indent=1))

    m = result["machine"]
    print(f"\n=== fastenc GPU check: {m.get('gpu')} ({m.get('capability')}), torch {m.get('torch')} "
          f"CUDA {m.get('torch_cuda')}, triton {m.get('triton')}, commit {str(m.get('commit'))[:10]}")
    for s in steps:
        print(f"  step {s['step']:<14} rc={s['rc']:<8} {s['seconds']} s")
    b = result["build"] or {}
    print(f"  build: cuda backend {b.get('cuda_backend', 'not built')}; archs {b.get('archs')}; "
          f"{(b.get('seconds') or 0):.0f} s")
    t = result["op_tests"]
    if t and "tests" in t:
        print(f"  op tests: {t['passed']} passed, {t['failures'] + t['errors']} failed, {t['skipped']} skipped")
        for name in t["failed_tests"][:20]:
            print(f"    FAILED {name}")
    meas = result["measure"]
    if meas:
        c = meas["ceilings"]
        print(f"  ceilings: copy {c['copy_bandwidth']['value']:.0f} GB/s, bf16 GEMM {c['gemm_bf16']['value']:.0f} TFLOP/s")
        print(f"\n{'op':<11} {'backend':<9} {'dtype':<5} {'shape':<28} {'time us':>9} {'rate':>14} {'of ceil':>8} "
              f"{'max err':>9}")
        for r in meas["timings"]:
            head = f"{r['op']:<11} {r['backend']:<9} {r['dtype']:<5} {r['shape']:<28}"
            if "median_ms" not in r:
                print(f"{head} {'-':>9} {r.get('skipped') or r.get('error', '')}"[:160])
                continue
            if "TFLOP/s" in r:
                rate, frac = f"{r['TFLOP/s']:.1f} TFLOP/s", r["frac_gemm"]
            else:
                rate, frac = f"{r.get('GB/s', 0):.0f} GB/s", r.get("frac_copy_bw", 0)
            err = r.get("max_abs_err_vs_reference")
            err_s = "-" if err is None else f"{err:.2e}"
            print(f"{head} {r['median_ms'] * 1e3:>9.1f} {rate:>14} {frac:>7.0%} {err_s:>9}")
        for e in meas.get("errors", []):
            print(f"  note: {e}")
    print(f"\nwrote {out_dir / 'gpu_check.json'}")
    failed_steps = [s for s in steps if s["rc"] not in ("0", "skipped")]
    return 1 if failed_steps else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["build", "measure", "summarize"])
    p.add_argument("--out", required=True)
    p.add_argument("--dtypes", default="bf16,fp16,fp32", help="measure: comma-separated of fp32, fp16, bf16")
    p.add_argument("--budget-s", type=float, default=100.0, help="measure: stop starting new cases after this")
    a = p.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT))
    if a.what == "build":
        return build(out)
    if a.what == "measure":
        import torch
        if not torch.cuda.is_available():
            print("gpu_check: no CUDA device visible to torch", file=sys.stderr)
            return 2
        measure(out, [d.strip() for d in a.dtypes.split(",") if d.strip()], a.budget_s)
        return 0
    return summarize(out)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
