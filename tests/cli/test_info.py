"""`fastenc info` and the import contract (cheap import: no triton, no build, no device query)."""
import subprocess
import sys


def run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "fastenc", *args], capture_output=True, text=True, timeout=120)


def test_info_lists_every_op_and_backend():
    out = run("info")
    assert out.returncode == 0, out.stderr
    for op in ("layer_norm", "rms_norm", "gelu", "geglu", "rope", "attention"):
        assert op in out.stdout
    for backend in ("reference", "triton", "cuda", "cpu"):
        assert backend in out.stdout
    assert "torch" in out.stdout and "python" in out.stdout


def test_info_lists_every_architecture_and_head():
    from fastenc.models import architecture

    out = run("info")
    assert out.returncode == 0, out.stderr
    lines = {line.split()[0]: line for line in out.stdout.splitlines() if line.strip()}
    for name, spec in architecture.architectures().items():
        assert name in lines, name
        for task, (_, hf) in spec.heads.items():
            assert f"{hf} ({task})" in lines[name]


def test_import_is_cheap():
    # torch's own import (~1.3 s here) is measured apart; fastenc's share on top of it must stay small so
    # that `python -c "import fastenc"` stays under 2 s on a 2-core machine.
    code = ("import time, sys; t = time.perf_counter(); import torch; t1 = time.perf_counter(); import fastenc; "
            "dt = time.perf_counter() - t1; print(dt, 'triton' in sys.modules, 'transformers' in sys.modules, "
            "fastenc.extension.loaded())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    dt, has_triton, has_tf, loaded = out.stdout.split()
    assert has_triton == "False", "import fastenc must not import triton"
    assert has_tf == "False", "import fastenc must not import transformers"
    assert loaded == "False", "import fastenc must not build or load the extension"
    assert float(dt) < 0.6, f"import fastenc took {float(dt):.2f} s on top of torch"
