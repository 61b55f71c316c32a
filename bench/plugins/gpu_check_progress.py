"""pytest plugin of bench/gpu_check.sh: every test's outcome goes into OUT/gpu_check.json as it happens
(`progress.<step>`: counts, failed test ids, the last test), so a process killed by a device fault or cut at
its limit still leaves what ran. Failures are written at once, passes at most twice a second.

Enabled by `-p gpu_check_progress` with GPU_CHECK_OUT (the output folder) and GPU_CHECK_STEP (the step name).
"""
from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]
_STATE = {"passed": 0, "failed": 0, "skipped": 0, "failed_tests": [], "last": None, "finished": False}
_SAVED = [0.0]
_GC: list = []


def _gc():
    if not _GC:
        spec = importlib.util.spec_from_file_location("_gpu_check", _ROOT / "bench" / "gpu_check.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _GC.append(mod)
    return _GC[0]


def _flush(force: bool) -> None:
    out, step = os.environ.get("GPU_CHECK_OUT"), os.environ.get("GPU_CHECK_STEP")
    if not out or not step or (not force and time.monotonic() - _SAVED[0] < 0.5):
        return
    gc = _gc()
    res = gc.load(Path(out))
    res.setdefault("progress", {})[step] = dict(_STATE, failed_tests=_STATE["failed_tests"][:200])
    gc.save(Path(out), res)
    _SAVED[0] = time.monotonic()


def pytest_runtest_logreport(report):
    if report.when != "call" and report.outcome == "passed":
        return  # setup/teardown that passed: the call phase counts the test
    if report.when == "teardown" and report.outcome == "skipped":
        return
    _STATE["last"] = report.nodeid
    if report.outcome == "failed":
        _STATE["failed"] += 1
        _STATE["failed_tests"].append(f"{report.nodeid} ({report.when})")
        _flush(force=True)
        return
    _STATE[report.outcome] = _STATE.get(report.outcome, 0) + 1
    _flush(force=False)


def pytest_sessionfinish(session, exitstatus):
    _STATE["finished"] = True
    _flush(force=True)
