"""`fastenc info` and the import contract (cheap import: no triton, no build, no device query)."""
import json
import subprocess
import sys


def run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "fastenc", *args], capture_output=True, text=True, timeout=120)


def test_info_lists_every_op_and_backend():
    out = run("info")
    assert out.returncode == 0, out.stderr
    for op in ("layer_norm", "rms_norm", "gelu", "geglu", "swiglu", "rope", "attention"):
        assert op in out.stdout
    for backend in ("reference", "triton", "cuda", "cpu"):
        assert backend in out.stdout
    assert "torch" in out.stdout and "python" in out.stdout


def test_info_build_names_the_int8_path():
    from fastenc import extension

    if extension.cpu_available():
        import pytest

        pytest.skip("the cpu extension cannot load here")
    out = run("info", "--build")
    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stdout.splitlines() if ln.strip().startswith("int8 GEMM:"))
    chosen = extension.load().int8_isa_best()
    assert line.split(":", 1)[1].split()[0] == chosen and "avx2" in line, line


def test_info_lists_every_architecture_and_head():
    from fastenc.models import architecture

    out = run("info")
    assert out.returncode == 0, out.stderr
    lines = {line.split()[0]: line for line in out.stdout.splitlines() if line.strip()}
    for name, spec in architecture.architectures().items():
        assert name in lines, name
        for task, (_, hf) in spec.heads.items():
            assert f"{hf} ({task})" in lines[name]


_IMPORT_PROBE = """
import json, subprocess, sys, time
t0 = time.process_time()
import torch
t1 = time.process_time()
calls = []
for name in ("is_available", "device_count", "get_device_properties", "get_device_capability", "init"):
    real = getattr(torch.cuda, name)
    setattr(torch.cuda, name, lambda *a, _n=name, _r=real, **k: (calls.append(_n), _r(*a, **k))[1])
real_popen = subprocess.Popen.__init__
def popen(self, *a, **k):
    calls.append("subprocess")
    real_popen(self, *a, **k)
subprocess.Popen.__init__ = popen
before = set(sys.modules)
import fastenc
t2 = time.process_time()
new = sorted(set(sys.modules) - before)
print(json.dumps({"torch_cpu_s": t1 - t0, "fastenc_cpu_s": t2 - t1, "calls": calls, "new": new,
                  "loaded": fastenc.extension.loaded()}))
"""


def test_import_is_cheap():
    # What `import fastenc` does on top of torch, counted rather than timed on the wall clock (a loaded machine
    # slows the wall clock, not the work): only fastenc's own modules and the standard library are imported (no
    # triton, transformers, numpy, ...), no device is queried, no process is started, nothing is built or loaded,
    # and its CPU time is a small share of torch's own import, measured in the same process.
    out = subprocess.run([sys.executable, "-c", _IMPORT_PROBE], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    top = {m.split(".")[0] for m in r["new"]}
    foreign = sorted(t for t in top - {"fastenc"} if t not in sys.stdlib_module_names)
    assert not foreign, f"import fastenc imports {foreign}"
    assert r["calls"] == [], f"import fastenc called {r['calls']}"
    assert r["loaded"] is False, "import fastenc must not build or load the extension"
    assert len(r["new"]) < 80, f"import fastenc imports {len(r['new'])} modules: {r['new']}"
    assert r["fastenc_cpu_s"] < 0.5 * r["torch_cpu_s"], (
        f"import fastenc took {r['fastenc_cpu_s']:.2f} s of CPU, torch's import {r['torch_cpu_s']:.2f} s")
