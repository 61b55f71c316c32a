"""Reproducible test data: fastenc.testing.randn draws from a per-test stream seeded by the test's node id, never
from (or into) torch's global generator; a failing test's report names its seed; FASTENC_TEST_SEED overrides it."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from fastenc import testing

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"


def _draws(node_id: str, base: int | None = None) -> list[torch.Tensor]:
    testing.set_test_seed(node_id, base)
    return [testing.randn(3, 17), testing.randn(5, dtype=torch.float16), testing.randn(2, 2, scale=3.0)]


def test_same_id_same_data():
    a = _draws("tests/ops/test_x.py::test_y[cpu-fp32-17x1000]")
    b = _draws("tests/ops/test_x.py::test_y[cpu-fp32-17x1000]")
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_different_ids_different_data():
    a = _draws("tests/ops/test_x.py::test_y[cpu-fp32]")
    b = _draws("tests/ops/test_x.py::test_y[cpu-fp16]")
    for x, y in zip(a, b):
        assert not torch.equal(x, y)


def test_calls_in_one_test_draw_distinct_streams():
    testing.set_test_seed("tests/ops/test_x.py::test_streams")
    x, y = testing.randn(64), testing.randn(64)
    assert not torch.equal(x, y)
    assert torch.equal(testing.randn(8, seed=11), testing.randn(8, seed=11)), "an explicit seed is the same data"


def test_global_rng_untouched():
    before = torch.get_rng_state()
    expected = torch.randn(16)
    torch.set_rng_state(before)
    testing.randn(4, 5)
    testing.randn(3, seed=7)
    testing.generator()
    assert torch.equal(torch.get_rng_state(), before), "randn changed torch's global generator state"
    assert torch.equal(torch.randn(16), expected)


def test_fixture_sets_base_from_node_id(request, _fastenc_seed):
    assert testing.current_seed() == (request.node.nodeid, testing.seed_for_test(request.node.nodeid))
    assert _fastenc_seed == testing.seed_for_test(request.node.nodeid)


def test_seed_override_and_bad_value(monkeypatch):
    monkeypatch.setenv("FASTENC_TEST_SEED", "1234")
    assert testing.seed_for_test("a") == testing.seed_for_test("b") == 1234
    monkeypatch.setenv("FASTENC_TEST_SEED", "twelve")
    with pytest.raises(ValueError, match="FASTENC_TEST_SEED must be an integer, got 'twelve'"):
        testing.seed_for_test("a")


def test_seed_is_the_same_in_another_process():
    """sha256 of the id, not Python's salted hash(): a fresh interpreter with another hash seed draws the same."""
    node = "tests/ops/test_x.py::test_y[triton-fp16-1x384]"
    code = ("from fastenc import testing; testing.set_test_seed(%r); "
            "print(testing.current_seed()[1], testing.randn(6).tolist())" % node)
    env = {k: v for k, v in os.environ.items() if k != "FASTENC_TEST_SEED"}
    env["PYTHONHASHSEED"] = "12345"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    base, data = out.split(" ", 1)
    testing.set_test_seed(node)
    assert int(base) == testing.current_seed()[1]
    assert data.strip() == str(testing.randn(6).tolist())


def _run_failing_test(tmp_path: Path, extra_env: dict) -> str:
    """Run a failing test twice in one session (the same node id) with this conftest; returns pytest's output."""
    (tmp_path / "conftest.py").write_text(CONFTEST.read_text())
    (tmp_path / "test_fail.py").write_text(textwrap.dedent("""
        import torch
        from fastenc import testing

        def test_fails():
            x = testing.randn(4)
            y = torch.rand(2)  # the global generator is seeded per test as well
            assert False, "data " + repr(x.tolist() + y.tolist())
    """))
    env = {k: v for k, v in os.environ.items() if k != "FASTENC_TEST_SEED"}
    env.update(extra_env)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--keep-duplicates",
                           "test_fail.py", "test_fail.py"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return proc.stdout


def _lines(out: str, prefix: str) -> list[str]:
    """The lines of pytest's output that start with `prefix` (after the traceback's 'E' margin)."""
    lines = [ln.strip() for ln in out.splitlines() if ln.removeprefix("E").strip().startswith(prefix)]
    assert lines, f"no line with {prefix!r} in:\n{out}"
    return lines


def test_failure_report_names_seed_and_replays(tmp_path):
    """A failing test's report says 'fastenc seed: <id> base <n>'; the same id draws the same data again, and
    FASTENC_TEST_SEED=<n> replays base n."""
    first = _run_failing_test(tmp_path, {})
    seeds = _lines(first, "fastenc seed: test_fail.py::test_fails base ")
    base = testing.seed_for_test("test_fail.py::test_fails")
    assert len(seeds) == 2 and all(ln.endswith(f"base {base}") for ln in seeds), seeds
    data = _lines(first, "AssertionError: data ")
    assert len(data) == 2 and data[0] == data[1], data
    replay = _run_failing_test(tmp_path, {"FASTENC_TEST_SEED": str(base)})
    assert _lines(replay, "AssertionError: data ") == data
