"""Every Triton kernel (each fastenc.kernels.<op> module's compile_specs()) compiles for sm_90 and sm_80 with
triton.compile(target=GPUTarget(...)) and ptxas reports no register spills; registers / shared memory per
kernel are printed as a table at the end. Needs triton, not a GPU.

Compiling needs the real JIT while the test session runs under TRITON_INTERPRET=1, so the compile runs once
in a subprocess (`python -m fastenc.kernels._compile`) and each (kernel, arch) is checked from its report.
"""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile

import pytest

pytest.importorskip("triton")

from fastenc.kernels._compile import kernel_modules  # noqa: E402

CCS = (90, 80)
# A hang guard, not a speed test: the driver prints a line as each compile finishes, and the run fails only when
# no compile finished for STALL_S (one kernel compiles in seconds to a minute even on a loaded 2-core machine),
# however long the whole suite takes on a slow machine. FASTENC_COMPILE_STALL_S overrides it.
STALL_S = float(os.environ.get("FASTENC_COMPILE_STALL_S", "600"))


def run_with_progress(cmd: list[str], env: dict, stall_s: float) -> tuple[int, list[str], str]:
    """Run cmd; (returncode, stdout lines, stderr tail). Killed, with pytest.fail naming the last line it printed,
    when it prints nothing for stall_s seconds."""
    import queue
    import threading
    import time

    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue = queue.Queue()
    err: list[str] = []
    threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stdout] + [lines.put(None)], daemon=True).start()
    threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True).start()
    out, last = [], time.monotonic()
    while True:
        try:
            ln = lines.get(timeout=min(5.0, stall_s))
        except queue.Empty:
            if time.monotonic() - last > stall_s:
                proc.kill()
                proc.wait()
                pytest.fail(f"{cmd[2] if len(cmd) > 2 else cmd[0]}: no progress for {stall_s:.0f} s after "
                            f"{len(out)} line(s); last: {out[-1] if out else '(none)'}\n{''.join(err)[-2000:]}")
            continue
        if ln is None:
            break
        out.append(ln.rstrip("\n"))
        last = time.monotonic()
    rc = proc.wait()
    return rc, out, "".join(err)[-4000:]


def _collect():
    params, modules_without = [], []
    for module in kernel_modules():
        mod = importlib.import_module(module)
        if not hasattr(mod, "compile_specs"):
            modules_without.append(module)
            continue
        for spec in mod.compile_specs():
            for cc in CCS:
                short = module.rsplit(".", 1)[1]
                params.append(pytest.param(module, spec["name"], cc, id=f"{short}-{spec['name']}-sm{cc}"))
    return params, modules_without


PARAMS, MODULES_WITHOUT_SPECS = _collect()


@pytest.fixture(scope="module")
def report(write_table):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "compile.json")
        rc, _, stderr = run_with_progress([sys.executable, "-m", "fastenc.kernels._compile", "--cc",
                                           ",".join(map(str, CCS)), "--jobs", "2", "--json", out], env, STALL_S)
        if not os.path.exists(out):
            pytest.fail(f"kernel compile driver produced no report (rc={rc}):\n{stderr}")
        with open(out) as f:
            results = json.load(f)
    yield {(r["module"], r["name"], r["cc"]): r for r in results}
    lines = ["", "Triton kernels compiled (registers / shared memory bytes / spill store+load bytes / warps):",
             f"{'arch':<6} {'regs':>4} {'smem':>6} {'spill':>5} {'warps':>5}  kernel"]
    for r in sorted(results, key=lambda r: (r["module"], str(r["name"]), -(r["cc"] or 0))):
        if "error" in r:
            lines.append(f"sm_{r['cc']:<3} ERROR  {r['module']}:{r['name']}: {r['error'].splitlines()[0][:120]}")
        else:
            lines.append(f"sm_{r['cc']:<3} {r['registers']:>4} {r['shared_bytes']:>6} "
                         f"{r['spill_stores'] + r['spill_loads']:>5} {r['num_warps']:>5}  "
                         f"{r['module'].rsplit('.', 1)[1]}:{r['name']}")
    write_table(lines)


def test_every_kernel_module_has_compile_specs():
    assert kernel_modules(), "no fastenc.kernels modules found"
    assert not MODULES_WITHOUT_SPECS, f"modules without compile_specs(): {MODULES_WITHOUT_SPECS}"
    for module in kernel_modules():
        specs = importlib.import_module(module).compile_specs()
        assert specs, f"{module}.compile_specs() is empty"
        for s in specs:
            assert {"name", "fn", "signature", "constexprs", "num_warps", "num_stages"} <= set(s), (module, s.get("name"))


@pytest.mark.parametrize("module,name,cc", PARAMS)
def test_kernel_compiles_without_spills(report, module, name, cc, record_property):
    r = report.get((module, name, cc))
    assert r is not None, f"{module}:{name} sm_{cc} missing from the compile report"
    assert "error" not in r, f"{module}:{name} sm_{cc} failed to compile:\n{r['error']}"
    record_property(f"sm_{cc}:{name}", f"regs={r['registers']} smem={r['shared_bytes']} "
                                        f"spills={r['spill_stores']}+{r['spill_loads']}")
    print(f"{module}:{name} sm_{cc}: {r['registers']} registers, {r['shared_bytes']} B shared memory")
    assert r["spill_stores"] == 0 and r["spill_loads"] == 0, (
        f"{module}:{name} sm_{cc} spills registers: {r['spill_stores']} B stores, {r['spill_loads']} B loads "
        f"({r['registers']} registers)")


def test_compile_for_refuses_interpreted_kernels():
    """Under TRITON_INTERPRET=1 kernels are interpreter objects: compile_for must say so, not crash obscurely."""
    from fastenc import registry
    from fastenc.kernels._compile import compile_for
    from fastenc.kernels.gelu import compile_specs

    if not registry.interpreter_on():
        pytest.skip("only meaningful under the interpreter")  # on a GPU machine the JIT objects compile
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        compile_for(compile_specs()[0], 90)


def test_progress_guard_waits_for_slow_progress_and_stops_a_hang():
    # a run longer than the stall window passes while it keeps printing; a silent one is stopped after the window
    slow = "import time\nfor i in range(4):\n    print(i, flush=True)\n    time.sleep(1)\n"
    rc, out, _ = run_with_progress([sys.executable, "-c", slow], dict(os.environ), stall_s=2.5)
    assert rc == 0 and out == ["0", "1", "2", "3"]
    with pytest.raises(pytest.fail.Exception, match=r"no progress for 2 s after 1 line\(s\); last: started"):
        run_with_progress([sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"],
                          dict(os.environ), stall_s=2)
