"""Steps of bench/gpu_check.sh and the one results file they share, OUT/gpu_check.json, rewritten (atomically)
after every step and every measured case, so a crash or a cut keeps what was done, and written on the early
exits too (no GPU, torch without CUDA, failed install) with the reason.

  python bench/gpu_check.py init      --out DIR [--dry-run] [--budget-s S]
  python bench/gpu_check.py abort     --out DIR --reason TEXT        # record an early exit: status "aborted"
  python bench/gpu_check.py build     --out DIR [--dry-run]          # build + load the extension
  python bench/gpu_check.py step      --out DIR --name N --rc RC --seconds S --limit S [--optional] [--junit F]
  python bench/gpu_check.py skip      --out DIR --name N --reason TEXT [--optional]
  python bench/gpu_check.py measure   --out DIR [--dry-run] [--budget-s S] [--dtypes bf16,fp16,fp32]
  python bench/gpu_check.py summarize --out DIR                      # final status, table, exit code

The measurements are fastenc.benchmark's own (ceilings, the quick cases of every op's benchmark spec in
fastenc/benchmark/ops with their bytes/FLOPs models and calls, tolerance verdict against the reference): every fastenc backend the registry says runs here, beside the
baselines measured in the same process. `--dry-run` (a CPU machine): device cpu, fp32, tiny cases, the
reference and cpu backends standing in for the GPU ones. Exit codes: 0 passed, 1 failed, 2 aborted,
3 incomplete (a required step skipped or cut for time).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = "gpu_check.json"
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


# ---------------------------------------------------------------- the results file
def _path(out: Path) -> Path:
    return out / RESULTS


def load(out: Path) -> dict:
    p = _path(out)
    if p.exists():
        try:
            return json.loads(p.read_text())
        except ValueError:
            pass
    return {"status": "running", "reason": None, "dry_run": None, "steps": [], "tests": {}, "build": None,
            "measure": None}


def save(out: Path, res: dict) -> None:
    """Write the results atomically (a reader never sees half a file; a crash keeps the last whole one)."""
    p = _path(out)
    tmp = p.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(_clean(res), indent=1))
    os.replace(tmp, p)


def _clean(obj):
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, float) and (obj != obj or obj in (float("inf"), float("-inf"))):
        return None  # JSON has no NaN/Infinity
    return obj


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _machine() -> dict:
    info = {"python": platform.python_version(), "host": platform.node(), "cpu_count": os.cpu_count()}
    try:
        import torch
        info.update(torch=torch.__version__, torch_cuda=torch.version.cuda)
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            info.update(gpu=p.name, capability=f"sm_{p.major}{p.minor}", sms=p.multi_processor_count,
                        memory_gib=round(p.total_memory / 2**30, 1))
    except Exception as e:  # noqa: BLE001  (the record says why)
        info["torch_error"] = f"{type(e).__name__}: {e}"
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


def init(out: Path, dry_run: bool, budget_s: float) -> int:
    res = load(out)
    res.update(status="running", reason=None, dry_run=dry_run, started=_now(), budget_s=budget_s,
               machine=_machine(), backward_test_files=sorted(p.name for p in (ROOT / "tests/ops").glob("*backward*.py")))
    save(out, res)
    return 0


def abort(out: Path, reason: str) -> int:
    res = load(out)
    res.setdefault("machine", None)
    res.update(status="aborted", reason=reason, finished=_now())
    save(out, res)
    print(f"gpu_check: {reason}", file=sys.stderr)
    return 2


# ---------------------------------------------------------------- steps and op tests
def junit(path: Path) -> dict | None:
    """Counts and failed test ids of a pytest junit report (partial when pytest was interrupted)."""
    if not path.exists():
        return None
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:
        return {"error": f"unreadable junit xml: {e}"}
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    tot = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    tot["passed"] = tot["tests"] - tot["failures"] - tot["errors"] - tot["skipped"]
    tot["failed_tests"] = [f"{c.get('classname')}::{c.get('name')}" for c in root.iter("testcase")
                           if c.find("failure") is not None or c.find("error") is not None][:200]
    return tot


def _status(rc: int) -> str:
    if rc == 0:
        return "passed"
    if rc in (124, 137):
        return "timed_out"  # cut at its limit: not passed, whatever it had done
    return "failed"


def step(out: Path, name: str, rc: int, seconds: float, limit: float, optional: bool, junit_path: str | None) -> int:
    res = load(out)
    rec = {"step": name, "status": _status(rc), "rc": rc, "seconds": seconds, "limit_s": limit, "optional": optional}
    if junit_path:
        t = junit(Path(junit_path))
        res.setdefault("tests", {})[name] = t
        if t is None:
            prog = (res.get("progress") or {}).get(name)
            rec["note"] = "no junit report written" + (
                f"; before it stopped: {prog['passed']} passed, {prog['failed']} failed, last {prog['last']}"
                if prog else "")
            if prog:  # the per-test record of the progress plugin stands in for the report
                res.setdefault("tests", {})[name] = {
                    "tests": prog["passed"] + prog["failed"] + prog["skipped"], "failures": prog["failed"],
                    "errors": 0, "skipped": prog["skipped"], "passed": prog["passed"],
                    "failed_tests": prog["failed_tests"], "from": "progress (no junit report)"}
            if rc == 0:
                rec["status"] = "failed"
        elif rc == 5:
            rec["note"] = "pytest collected no test"
    res["steps"].append(rec)
    save(out, res)
    return 0


def skip(out: Path, name: str, reason: str, optional: bool) -> int:
    res = load(out)
    res["steps"].append({"step": name, "status": "skipped", "reason": reason, "optional": optional})
    save(out, res)
    return 0


# ---------------------------------------------------------------- build
def build(out: Path, dry_run: bool) -> int:
    from fastenc import extension

    t0 = time.perf_counter()
    info = {"archs": extension.cuda_archs(), "build_dir": str(extension.build_dir()), "with_cuda": extension.with_cuda()}
    # the two halves build apart: the cpu half always, the cuda half on the GPU (a dry run has only the former)
    for kind, loader in (("cpu", extension.load), ("cuda", None if dry_run else extension.load_cuda)):
        if loader is None:
            continue
        try:
            mod = loader(verbose=False)
            info[f"{kind}_built"] = True
            if kind == "cuda":
                info["has_cuda"] = bool(mod.has_cuda())
        except Exception as e:  # noqa: BLE001  (the record says why; the exit code fails the step)
            info[f"{kind}_built"], info[f"{kind}_error"] = False, f"{type(e).__name__}: {str(e)[:3000]}"
    info["built"] = info.get("cpu_built", False) and (dry_run or info.get("cuda_built", False))
    info["seconds"] = time.perf_counter() - t0
    info["meta"] = {"cpu": extension.meta("cpu"), "cuda": None if dry_run else extension.meta("cuda")}
    info["cpu_backend"] = extension.cpu_available() or "available"
    info["cuda_backend"] = extension.cuda_available() or "available"
    res = load(out)
    res["build"] = info
    save(out, res)
    print(json.dumps(info, indent=1))
    if dry_run:  # the CPU half stands in for the whole
        return 0 if info["built"] and info["cpu_backend"] == "available" else 3
    return 0 if info.get("has_cuda") and info["cuda_backend"] == "available" else 3


# ---------------------------------------------------------------- measurements (fastenc.benchmark)
def measure(out: Path, dry_run: bool, budget_s: float, dtypes: list[str]) -> int:
    import torch

    import fastenc  # noqa: F401  (registers every op)
    from fastenc.benchmark import ceilings, kernels

    device = "cpu" if dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        res = load(out)
        res["measure"] = {"device": device, "failures": ["no CUDA device visible to torch"], "rows": [], "done": False}
        save(out, res)
        return 1
    if dry_run:
        dtypes = ["fp32"]
    t0 = time.perf_counter()
    res = load(out)
    meas = res["measure"] = {"device": device, "dtypes": dtypes, "ceilings": {}, "rows": [], "failures": [],
                             "not_run": [], "done": False}
    save(out, res)
    cases = kernels.cases(quick=True)  # the quick cases of every op's spec (fastenc.benchmark.ops)
    if dry_run:
        cases = [kernels.tiny(c) for c in cases]
    for dname in dtypes:
        dtype = getattr(torch, DTYPES[dname])
        try:
            meas["ceilings"][dname] = ceilings.measure(device, dtype, quick=True)
        except Exception as e:  # noqa: BLE001
            meas["failures"].append(f"ceilings {dname}: {type(e).__name__}: {e}"[:400])
            meas["ceilings"][dname] = {}
        save(out, res)
        for case in cases:
            label = f"{case.op} {dname} {case.shape}"
            if time.perf_counter() - t0 > budget_s:
                meas["not_run"].append(f"{label}: skipped, the step's time budget of {budget_s:.0f} s was spent")
                continue
            try:
                rows = kernels.run_case(case, device, dtype, meas["ceilings"][dname], quick=True, compile_ref=False,
                                        **({"repeats": 2, "min_time_s": 0.0} if dry_run else {}))
            except Exception as e:  # noqa: BLE001  (a setup failure of the case itself)
                rows = [{"op": case.op, "shape": case.shape, "dtype": dname, "provider": "case",
                         "error": f"{type(e).__name__}: {str(e)[:300]}"}]
            meas["rows"] += rows
            meas["failures"] += kernels.failures(rows)
            print(f"  {label}: " + ", ".join(_brief(r) for r in rows if r["provider"].startswith("fastenc-")))
            save(out, res)  # after every case: a crash keeps what was measured
            if device == "cuda":
                torch.cuda.empty_cache()
    meas["done"] = True
    meas["seconds"] = time.perf_counter() - t0
    save(out, res)
    return 1 if meas["failures"] else 0


def _brief(r: dict) -> str:
    if "error" in r:
        return f"{r['provider']} ERROR"
    if "skipped" in r:
        return f"{r['provider']} skipped"
    ok = {True: "ok", False: "OUT OF TOLERANCE", None: "-"}[r.get("within_tolerance")]
    return f"{r['provider']} {r['median_ms'] * 1e3:.1f} us {ok}"


# ---------------------------------------------------------------- summary
REQUIRED = ("build", "ops_cuda", "ops_triton", "ops_rest", "measure")
# Status: failed (a required step failed, an op test failed, a measured row errored or broke the tolerance rule),
# else incomplete (a required step cut at its limit, skipped for time or never run; cases not measured for time),
# else passed. Optional steps (the benchmarks) never change it.


def summarize(out: Path) -> int:
    res = load(out)
    if res.get("status") == "aborted":
        print(f"gpu_check: aborted: {res.get('reason')}")
        return 2
    steps = {s["step"]: s for s in res["steps"]}
    required = [s for s in res["steps"] if not s.get("optional")]
    failed = [s["step"] for s in required if s["status"] == "failed"]
    cut = [s["step"] for s in required if s["status"] == "timed_out"]  # what ran is judged; the rest is missing
    missing = [n for n in REQUIRED if n not in steps]
    skipped = [s["step"] for s in required if s["status"] == "skipped"]
    meas = res.get("measure") or {}
    bad_rows = meas.get("failures", [])
    tests_failed = sum((t or {}).get("failures", 0) + (t or {}).get("errors", 0)
                       for t in (res.get("tests") or {}).values() if isinstance(t, dict))
    if failed or bad_rows or tests_failed:
        status, rc = "failed", 1
    elif skipped or cut or missing or meas.get("not_run"):
        status, rc = "incomplete", 3
    else:
        status, rc = "passed", 0
    res.update(status=status, finished=_now(), failed_steps=failed, cut_steps=cut, skipped_steps=skipped,
               missing_steps=missing,
               reason="; ".join(filter(None, [f"failed steps: {failed}" if failed else "",
                                              f"{len(bad_rows)} measured row(s) failed" if bad_rows else "",
                                              f"{tests_failed} op test(s) failed" if tests_failed else "",
                                              f"cut at their time limit: {cut}" if cut else "",
                                              f"skipped for time: {skipped}" if skipped else "",
                                              f"never ran: {missing}" if missing else "",
                                              f"{len(meas['not_run'])} measured case(s) not run for time"
                                              if meas.get("not_run") else ""])) or None)
    save(out, res)
    _print(res)
    return rc


def _print(res: dict) -> None:
    m = res.get("machine") or {}
    print(f"\n=== fastenc GPU check{' (dry run on CPU)' if res.get('dry_run') else ''}: {m.get('gpu')} "
          f"({m.get('capability')}), torch {m.get('torch')} CUDA {m.get('torch_cuda')}, triton {m.get('triton')}, "
          f"commit {str(m.get('commit'))[:10]}")
    for s in res["steps"]:
        extra = s.get("reason") or s.get("note") or ""
        print(f"  step {s['step']:<14} {s['status']:<10}{' (optional)' if s.get('optional') else '':<11} "
              f"{s.get('seconds', '-')!s:>4} s  {extra}")
    for name, t in (res.get("tests") or {}).items():
        if t and "tests" in t:
            print(f"  {name}: {t['passed']} passed, {t['failures'] + t['errors']} failed, {t['skipped']} skipped")
            for f in t["failed_tests"][:20]:
                print(f"    FAILED {f}")
    meas = res.get("measure") or {}
    for dname, c in (meas.get("ceilings") or {}).items():
        if c:
            print(f"  ceilings {dname}: copy {c['copy_bandwidth']['value']:.0f} GB/s, "
                  f"GEMM {c['gemm_rate']['value']:.1f} TFLOP/s")
    rows = [r for r in meas.get("rows", []) if "median_ms" in r]
    if rows:
        print(f"\n{'op':<11} {'provider':<16} {'dtype':<9} {'shape':<36} {'us':>8} {'of ceil':>8} {'x base':>7} {'tol':>4}")
        for r in rows:
            base = r.get("speedup_vs_eager") or r.get("speedup_vs_sdpa")
            tol = {True: "ok", False: "BAD", None: ""}[r.get("within_tolerance")]
            frac = r.get("frac_of_ceiling")
            print(f"{r.get('op', '?'):<11} {r.get('provider', '?'):<16} {r.get('dtype', '?'):<9} "
                  f"{str(r.get('shape', '?'))[:36]:<36} {r['median_ms'] * 1e3:>8.1f} "
                  f"{'' if frac is None else f'{frac:.0%}':>8} {'' if base is None else f'{base:.2f}':>7} {tol:>4}")
    for f in meas.get("failures", []):
        print(f"  FAILED {f}")
    for n in meas.get("not_run", [])[:10]:
        print(f"  not run: {n}")
    print(f"\nstatus: {res['status']}" + (f" ({res['reason']})" if res.get("reason") else ""))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["init", "abort", "build", "step", "skip", "measure", "summarize"])
    p.add_argument("--out", required=True)
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--reason", default="")
    p.add_argument("--name", default="")
    p.add_argument("--rc", type=int, default=0)
    p.add_argument("--seconds", type=float, default=0.0)
    p.add_argument("--limit", type=float, default=0.0)
    p.add_argument("--optional", action="store_true")
    p.add_argument("--junit", default=None)
    p.add_argument("--dtypes", default="bf16,fp16,fp32", help="measure: comma-separated of fp32, fp16, bf16")
    p.add_argument("--budget-s", type=float, default=None,
                   help="measure: stop starting new cases after this (default: the step's limit less 20 s)")
    a = p.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT))
    if a.what == "init":
        return init(out, a.dry_run, a.budget_s or 0.0)
    if a.what == "abort":
        abort(out, a.reason)
        return 0  # recorded; the script exits with 2
    if a.what == "build":
        return build(out, a.dry_run)
    if a.what == "step":
        return step(out, a.name, a.rc, a.seconds, a.limit, a.optional, a.junit)
    if a.what == "skip":
        return skip(out, a.name, a.reason, a.optional)
    if a.what == "measure":
        if a.budget_s is None:
            a.budget_s = max(10.0, float(os.environ.get("GPU_CHECK_STEP_LIMIT_S", "100")) - 20)
        return measure(out, a.dry_run, a.budget_s, [d.strip() for d in a.dtypes.split(",") if d.strip()])
    return summarize(out)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
