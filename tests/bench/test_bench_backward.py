"""Smoke test of `fastenc bench kernels --backward`: tiny shapes through the CLI, the JSON a reader relies on
(commit, machine, versions, ceilings), paired ratios with their spread, gradients that agree with the baseline."""
from __future__ import annotations

import json
import math

import torch

from fastenc import cli


def test_backward_cli_quick(tmp_path, capsys):
    rc = cli.main(["bench", "kernels", "--backward", "--quick", "--device", "cpu", "--ops", "attention,gelu,lora_linear",
                   "--no-compile", "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "backward.json").read_text())
    meta = data["meta"]
    assert meta["commit"] and meta["device"] == "cpu" and meta["machine"]["cpu"]
    assert meta["versions"]["torch"] == torch.__version__
    for c in ("copy_bandwidth", "gemm_rate"):
        assert math.isfinite(data["ceilings"][c]["value"]) and data["ceilings"][c]["value"] > 0
    rows = {r["op"]: r for r in data["rows"]}
    assert set(rows) == {"attention", "gelu", "lora_linear"}
    assert "sdpa_over_fastenc" in rows["attention"] and "torch-eager_over_fastenc" in rows["gelu"]
    for op, r in rows.items():
        assert math.isfinite(r["fastenc_ms"]) and r["fastenc_ms"] > 0, op
        ratio = r["sdpa_over_fastenc" if op == "attention" else "torch-eager_over_fastenc"]
        assert 0 < ratio["q20"] <= ratio["median"] <= ratio["q80"] and ratio["rounds"] >= 3, (op, ratio)
        assert r["grad_rel_err"] < 1e-4, (op, r["grad_rel_err"])  # fastenc's gradients are the baseline's
        assert r["backend"] == "cpu"
    assert rows["gelu"]["bytes"] > 0 and 0 < rows["gelu"]["fraction_of_copy_bandwidth"]
    assert rows["attention"]["flops"] > 0 and 0 < rows["attention"]["fraction_of_gemm_rate"]
    assert "gelu" in capsys.readouterr().out


def test_backward_cli_unknown_op(tmp_path, capsys):
    rc = cli.main(["bench", "kernels", "--backward", "--quick", "--device", "cpu", "--ops", "softmax",
                   "--out", str(tmp_path)])
    assert rc == 2
    assert "no backward benchmark for ['softmax']" in capsys.readouterr().err
