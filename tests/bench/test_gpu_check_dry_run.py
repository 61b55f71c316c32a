"""bench/gpu_check.sh on a CPU machine: `--dry-run` walks every step with the GPU calls replaced (cpu and
reference backends standing in, tiny cases) and writes a complete OUT/gpu_check.json; without a GPU the real
run aborts early with the reason in the JSON; the summary's exit codes follow the rows and steps."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_check.sh"
STEPS = ["build", "ops_cuda", "ops_triton", "ops_rest", "measure", "bench_kernels", "bench_models"]


def _gc():
    spec = importlib.util.spec_from_file_location("_gpu_check", ROOT / "bench" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k != "FASTENC_TEST_BACKENDS"}
    env.update(PYTHON=sys.executable, **extra)
    return env


def test_dry_run_walks_every_step_and_writes_a_complete_json(tmp_path):
    out = tmp_path / "out"
    res = subprocess.run(["bash", str(SCRIPT), "--dry-run", str(out)], env=_env(), capture_output=True, text=True,
                         timeout=900)
    log = res.stdout[-4000:] + res.stderr[-2000:]
    data = json.loads((out / "gpu_check.json").read_text())
    assert res.returncode == 0, log
    assert data["status"] == "passed" and data["dry_run"] is True and data["reason"] is None, log
    assert [s["step"] for s in data["steps"]] == STEPS
    steps = {s["step"]: s for s in data["steps"]}
    for name in STEPS[:5]:
        assert steps[name]["status"] == "passed" and not steps[name]["optional"], steps[name]
    assert steps["bench_models"]["status"] == "skipped" and steps["bench_models"]["optional"]
    assert data["build"]["built"] and data["build"]["cpu_backend"] == "available"
    for name in ("ops_cuda", "ops_triton", "ops_rest"):
        t = data["tests"][name]
        assert t["tests"] > 0 and t["passed"] == t["tests"] and not t["failed_tests"], (name, t)
        assert (out / f"{name}.xml").exists() and (out / f"{name}.log").exists()
        prog = data["progress"][name]  # written test by test, as they ran
        assert prog["finished"] and prog["passed"] == t["passed"] and prog["failed"] == 0, (name, prog)
    m = data["measure"]
    assert m["done"] and m["device"] == "cpu" and not m["failures"] and not m["not_run"]
    assert m["ceilings"]["fp32"]["copy_bandwidth"]["value"] > 0
    from fastenc.benchmark import kernels
    quick_ops = {c.op for c in kernels.cases(quick=True)}
    assert "lora_linear" in quick_ops
    timed = [r for r in m["rows"] if "median_ms" in r]
    for op in quick_ops:
        own = {r["provider"]: r for r in timed if r["op"] == op and r["provider"].startswith("fastenc-")}
        assert {"fastenc-reference", "fastenc-cpu"} <= set(own), (op, sorted(own))
        for r in own.values():
            assert r["within_tolerance"] is True and r["bytes"] > 0 and r["flops"] > 0, r
        assert any(r["op"] == op and not r["provider"].startswith("fastenc-") for r in timed), op  # a baseline
    skipped = {(r["op"], r["provider"]) for r in m["rows"] if "skipped" in r}
    assert ("attention", "fastenc-cuda") in skipped  # said, not silently dropped
    assert (out / "bench_kernels" / "kernels.json").exists()


def test_without_a_gpu_the_real_run_aborts_with_the_reason(tmp_path):
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    smi = fake_bin / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    smi.chmod(0o755)
    out = tmp_path / "out"
    res = subprocess.run(["bash", str(SCRIPT), str(out)], env=_env(PATH=f"{fake_bin}:{os.environ['PATH']}"),
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 2, res.stdout + res.stderr
    data = json.loads((out / "gpu_check.json").read_text())
    assert data["status"] == "aborted" and "no NVIDIA GPU" in data["reason"] and data["dry_run"] is False
    assert data["machine"]["torch"] and data["steps"] == []


def _results(gc, out, steps, rows=(), not_run=()):
    res = gc.load(out)
    res["steps"] = [{"step": n, "status": s, "optional": n.startswith("bench")} for n, s in steps]
    res["measure"] = {"rows": list(rows), "failures": [], "not_run": list(not_run)}
    from fastenc.benchmark import kernels
    res["measure"]["failures"] = kernels.failures(list(rows))
    gc.save(out, res)


@pytest.mark.parametrize("steps,rows,not_run,rc,status", [
    ([(n, "passed") for n in STEPS], [], [], 0, "passed"),
    ([(n, "passed") for n in STEPS[:-1]] + [("bench_models", "timed_out")], [], [], 0, "passed"),  # optional
    ([(n, "passed") for n in STEPS[:4]] + [("measure", "skipped")], [], [], 3, "incomplete"),
    ([(n, "passed") for n in STEPS[:3]] + [("ops_rest", "timed_out"), ("measure", "passed")], [], [], 3, "incomplete"),
    ([(n, "passed") for n in STEPS[:3]] + [("ops_rest", "failed"), ("measure", "passed")], [], [], 1, "failed"),
    ([(n, "passed") for n in STEPS[:3]], [], [], 3, "incomplete"),  # never ran
    ([(n, "passed") for n in STEPS], [], ["gelu fp32: skipped, budget spent"], 3, "incomplete"),
    ([(n, "passed") for n in STEPS], [{"op": "gelu", "shape": "s", "provider": "fastenc-cuda", "error": "boom"}],
     [], 1, "failed"),
    ([(n, "passed") for n in STEPS], [{"op": "gelu", "shape": "s", "provider": "fastenc-cuda", "median_ms": 1.0,
                                       "within_tolerance": False, "max_abs_err_vs_ref32": 1.0, "tolerance": 0.1}],
     [], 1, "failed"),
], ids=["passed", "optional-cut", "skipped-for-time", "cut", "step-failed", "missing", "cases-not-run", "row-error",
        "row-out-of-tolerance"])
def test_summary_exit_codes(tmp_path, capsys, steps, rows, not_run, rc, status):
    gc = _gc()
    _results(gc, tmp_path, steps, rows, not_run)
    assert gc.summarize(tmp_path) == rc
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    assert data["status"] == status
    assert (data["reason"] is None) == (status == "passed")


def test_step_records_timeouts_and_partial_junit(tmp_path):
    gc = _gc()
    xml = tmp_path / "ops.xml"
    xml.write_text('<testsuites><testsuite tests="3" failures="1" errors="0" skipped="1">'
                   '<testcase classname="t" name="a"/><testcase classname="t" name="b"><failure/></testcase>'
                   '<testcase classname="t" name="c"><skipped/></testcase></testsuite></testsuites>')
    gc.step(tmp_path, "ops_cuda", 124, 90, 90, False, str(xml))
    gc.step(tmp_path, "ops_triton", 0, 5, 90, False, str(tmp_path / "absent.xml"))
    res = gc.load(tmp_path)  # a process that died mid-run: only the progress plugin's record remains
    res["progress"] = {"ops_rest": {"passed": 7, "failed": 1, "skipped": 0, "failed_tests": ["t::x (call)"],
                                    "last": "t::y", "finished": False}}
    gc.save(tmp_path, res)
    gc.step(tmp_path, "ops_rest", -11, 30, 90, False, str(tmp_path / "absent.xml"))
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    cuda, triton, rest = data["steps"]
    assert cuda["status"] == "timed_out" and data["tests"]["ops_cuda"]["passed"] == 1
    assert data["tests"]["ops_cuda"]["failed_tests"] == ["t::b"]
    assert triton["status"] == "failed" and "no junit" in triton["note"]  # rc 0 without a report is no pass
    assert rest["status"] == "failed" and "last t::y" in rest["note"]
    assert data["tests"]["ops_rest"]["failures"] == 1 and data["tests"]["ops_rest"]["passed"] == 7
