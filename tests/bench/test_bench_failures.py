"""A fastenc provider that fails, or whose output breaks the tolerance rule, fails the kernel benchmark (an
`error` row, `within_tolerance` False, listed by kernels.failures); absent baselines stay `skipped`."""
from __future__ import annotations

import dataclasses

import torch

import fastenc  # noqa: F401  (registers every op)
from fastenc import registry
from fastenc.benchmark import kernels

CEIL = {"copy_bandwidth": {"value": 10.0}, "gemm_rate": {"value": 1.0}}


def _case():
    return kernels.tiny(next(c for c in kernels.cases(quick=True) if c.op == "gelu"))


def _run(**kw):
    return kernels.run_case(_case(), "cpu", torch.float32, CEIL, quick=True, compile_ref=False, warmup=0, **kw)


def _replace(monkeypatch, backend, **changes):
    impl = registry.impl("gelu", backend)
    monkeypatch.setitem(registry._REGISTRY["gelu"], backend, dataclasses.replace(impl, **changes))


def test_tiny_case_is_small_and_correct_rows_pass():
    case = _case()
    assert case.tokens <= 32 and case.op == "gelu"
    rows = _run(providers={"reference", "cpu", "torch-eager"})
    timed = {r["provider"]: r for r in rows if "median_ms" in r}
    assert {"fastenc-reference", "fastenc-cpu", "torch-eager"} <= set(timed)
    for name in ("fastenc-reference", "fastenc-cpu"):
        assert timed[name]["within_tolerance"] is True and timed[name]["tolerance"] > 0
    assert "within_tolerance" not in timed["torch-eager"]  # baselines are not held to fastenc's rule
    assert kernels.failures(rows) == []


def test_failing_fastenc_provider_is_an_error_not_a_skip(monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("kernel launch failed")

    _replace(monkeypatch, "cpu", fn=boom)
    rows = _run(providers={"reference", "cpu", "torch-eager"})
    row = next(r for r in rows if r["provider"] == "fastenc-cpu")
    assert "error" in row and "kernel launch failed" in row["error"] and "skipped" not in row
    assert any("fastenc-cpu" in f for f in kernels.failures(rows))


def test_unavailable_fastenc_backend_is_an_error(monkeypatch):
    _replace(monkeypatch, "cpu", available=lambda: "no C++ compiler found")
    rows = _run(providers={"reference", "cpu"})
    row = next(r for r in rows if r["provider"] == "fastenc-cpu")
    assert "no C++ compiler" in row["error"]


def test_wrong_output_breaks_the_tolerance_rule(monkeypatch):
    _replace(monkeypatch, "cpu", fn=lambda x, bias, approximate, *rest: torch.zeros_like(x))
    rows = _run(providers={"reference", "cpu"})
    row = next(r for r in rows if r["provider"] == "fastenc-cpu")
    assert row["within_tolerance"] is False and row["max_abs_err_vs_ref32"] > row["tolerance"]
    assert any("tolerance" in f for f in kernels.failures(rows))


def test_declared_limits_and_device_rules_are_skips():
    rows = _run()
    skipped = {r["provider"]: r["skipped"] for r in rows if "skipped" in r}
    assert "not cpu" in skipped["fastenc-cuda"]  # registry.runs_on's words
    assert "fastenc-triton" in skipped  # a test path under the interpreter (or no interpreter): never timed
    assert not [r for r in rows if "error" in r]


def test_cli_exits_nonzero_when_fastenc_fails(monkeypatch, tmp_path):
    import json

    from fastenc import cli

    def boom(*args, **kwargs):
        raise RuntimeError("kernel launch failed")

    _replace(monkeypatch, "cpu", fn=boom)
    rc = cli.main(["bench", "kernels", "--quick", "--device", "cpu", "--ops", "gelu", "--providers",
                   "reference,cpu,torch-eager", "--no-compile", "--no-plots", "--out", str(tmp_path)])
    assert rc == 1
    data = json.loads((tmp_path / "kernels.json").read_text())
    assert any("fastenc-cpu" in f and "kernel launch failed" in f for f in data["failures"])


def test_model_benchmark_fastenc_failure_is_recorded_or_raised(monkeypatch, tmp_path):
    import pytest

    from fastenc.benchmark import models

    def broken(hf_model):
        raise RuntimeError("cannot convert this model")

    monkeypatch.setattr(models, "fastenc_model", broken)
    spec = models.MODELS["bert-base"]
    failed: dict = {}
    fns, skipped = models.build_providers(spec, torch.nn.Linear(2, 2), "cpu", torch.float32, ["fastenc"], 1,
                                          tmp_path, print, failed)
    assert not fns and "fastenc" not in skipped and "cannot convert" in failed["fastenc"]
    with pytest.raises(RuntimeError, match="fastenc: RuntimeError: cannot convert"):
        models.build_providers(spec, torch.nn.Linear(2, 2), "cpu", torch.float32, ["fastenc"], 1, tmp_path, print)
