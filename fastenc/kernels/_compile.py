"""Ahead-of-time compile of every Triton kernel for a GPU target without a GPU (triton.compile + ptxas -v).

Convention: each module fastenc.kernels.<op> (names not starting with "_") exposes `compile_specs()`, a list of
  {"name": str, "fn": <@triton.jit kernel>, "signature": {arg: "*fp16"|"*fp32"|"*bf16"|"i32"|"i64"|"fp32"|
   "constexpr", ...}, "constexprs": {arg: value}, "num_warps": int, "num_stages": int}
(optional "divisible_by_16": [int arg names] marks integer args the JIT would specialize as multiples of 16;
pointer args are always marked 16-byte aligned, as the JIT does for torch tensors).
`compile_for(spec, cc)` builds the cubin for sm_<cc> and reads registers / spills from ptxas -v.
Compiling needs the real JIT (TRITON_INTERPRET unset); `python -m fastenc.kernels._compile` runs every spec
in a process of its own, which is how the build test calls it.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import pkgutil
import re
import subprocess
import sys
import tempfile
import time
from typing import Any


def kernel_modules() -> list[str]:
    """Names of every fastenc.kernels.<op> module (private helpers starting with '_' excluded)."""
    import fastenc.kernels as pkg

    return sorted(f"fastenc.kernels.{m.name}" for m in pkgutil.iter_modules(pkg.__path__) if not m.name.startswith("_"))


def _ptxas_usage(ptx: str, cc: int) -> dict[str, int]:
    """Run ptxas -v on the kernel's PTX (flags as Triton's own cubin step) and parse its resource report."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    ptxas = get_ptxas(cc).path
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        cmd = [ptxas, "-lineinfo", "-v", "--regAllocOptLevel=2", f"--gpu-name={sm_arch_from_capability(cc)}",
               src, "-o", os.path.join(d, "k.cubin")]
        log = subprocess.run(cmd, check=True, capture_output=True, text=True).stderr
    regs = re.findall(r"Used (\d+) registers", log)
    stores = re.findall(r"(\d+) bytes spill stores", log)
    loads = re.findall(r"(\d+) bytes spill loads", log)
    stack = re.findall(r"(\d+) bytes stack frame", log)
    if not regs:
        raise RuntimeError(f"could not read register usage from ptxas -v:\n{log}")
    return {"registers": max(map(int, regs)), "spill_stores": sum(map(int, stores)),
            "spill_loads": sum(map(int, loads)), "stack_bytes": max(map(int, stack or ["0"]))}


def compile_for(spec: dict, cc: int) -> dict[str, Any]:
    """Compile one spec for sm_<cc>; returns name, cc, registers, spill bytes, shared memory, seconds."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    fn = spec["fn"]
    if not isinstance(fn, JITFunction):
        raise RuntimeError(f"{spec['name']}: kernel is not a JITFunction (TRITON_INTERPRET is on?); run "
                           "`python -m fastenc.kernels._compile` in a process without TRITON_INTERPRET")
    sig = dict(spec["signature"])
    missing = [a for a in fn.arg_names if a not in sig]
    if missing:
        raise ValueError(f"{spec['name']}: signature lacks arguments {missing}")
    aligned = set(spec.get("divisible_by_16", ()))
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]]
             for a, t in sig.items() if t.startswith("*") or a in aligned}
    src = ASTSource(fn=fn, signature=sig, constexprs=dict(spec.get("constexprs", {})), attrs=attrs)
    t0 = time.perf_counter()
    compiled = triton.compile(src, target=GPUTarget("cuda", cc, 32),
                              options={"num_warps": spec["num_warps"], "num_stages": spec["num_stages"]})
    usage = _ptxas_usage(compiled.asm["ptx"], cc)
    return {"name": spec["name"], "cc": cc, "shared_bytes": int(compiled.metadata.shared),
            "num_warps": spec["num_warps"], "seconds": round(time.perf_counter() - t0, 2), **usage}


def _specs(module: str) -> list[dict]:
    mod = importlib.import_module(module)
    if not hasattr(mod, "compile_specs"):
        raise AttributeError(f"{module} has no compile_specs()")
    return list(mod.compile_specs())


def _job(args: tuple[str, int, int]) -> dict[str, Any]:
    module, index, cc = args
    spec = _specs(module)[index]
    out = {"module": module, "name": spec["name"], "cc": cc}
    try:
        out.update(compile_for(spec, cc))
    except Exception as e:  # reported per kernel; the test turns it into a failure
        out["error"] = f"{type(e).__name__}: {e}"[:4000]
    return out


def compile_all(ccs=(90, 80), modules: list[str] | None = None, jobs: int = 1,
                on_result=None) -> list[dict[str, Any]]:
    """Compile every spec of every kernel module for each cc; one result dict per (spec, cc), in work order.
    on_result(result), if given, is called as each compile finishes (in the order they finish)."""
    results: list[dict[str, Any]] = []
    work: list[tuple[str, int, int]] = []
    for module in modules or kernel_modules():
        try:
            specs = _specs(module)
        except Exception as e:
            results.append({"module": module, "name": None, "cc": None, "error": f"{type(e).__name__}: {e}"})
            continue
        if not specs:
            results.append({"module": module, "name": None, "cc": None, "error": "compile_specs() is empty"})
        work += [(module, i, cc) for i in range(len(specs)) for cc in ccs]
    report = on_result or (lambda r: None)
    for r in results:
        report(r)
    done: dict[int, dict[str, Any]] = {}
    if jobs > 1 and len(work) > 1:
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(jobs) as pool:
            futures = {pool.submit(_job, w): i for i, w in enumerate(work)}
            for f in as_completed(futures):
                done[futures[f]] = f.result()
                report(done[futures[f]])
    else:
        for i, w in enumerate(work):
            done[i] = _job(w)
            report(done[i])
    return results + [done[i] for i in range(len(work))]


def _line(r: dict[str, Any]) -> str:
    if "error" in r:
        return f"{r['module']}:{r['name']} sm_{r['cc']}: ERROR {r['error'].splitlines()[0]}"
    return (f"{r['module']}:{r['name']} sm_{r['cc']}: {r['registers']} regs, {r['spill_stores']}+"
            f"{r['spill_loads']} B spills, {r['shared_bytes']} B smem, {r['num_warps']} warps, {r['seconds']} s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Compile every fastenc Triton kernel for GPU targets (no GPU needed)")
    p.add_argument("--cc", default="90,80", help="compute capabilities, comma-separated (default 90,80)")
    p.add_argument("--module", action="append", help="only this module (repeatable)")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--json", help="write the results here")
    a = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("TRITON_INTERPRET is set: compiling needs the real JIT; unset it", file=sys.stderr)
        return 2
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    # one line per compile as it finishes (flushed: a caller can tell progress from a hang)
    res = compile_all(tuple(int(c) for c in a.cc.split(",")), a.module, a.jobs,
                      on_result=lambda r: print(_line(r), flush=True))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 1 if any("error" in r or r.get("spill_stores") or r.get("spill_loads") for r in res) else 0


if __name__ == "__main__":
    sys.exit(main())
