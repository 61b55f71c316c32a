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
TIMEOUT_S = 420


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
        proc = subprocess.run([sys.executable, "-m", "fastenc.kernels._compile", "--cc", ",".join(map(str, CCS)),
                               "--jobs", "2", "--json", out], env=env, capture_output=True, text=True,
                              timeout=TIMEOUT_S)
        if not os.path.exists(out):
            pytest.fail(f"kernel compile driver produced no report (rc={proc.returncode}):\n{proc.stderr[-4000:]}")
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
