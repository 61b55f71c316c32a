"""The packed-GEMM benchmark (fastenc.benchmark.gemm_pack): one case with its weights cycled over layers."""
from __future__ import annotations

import pytest
import torch

from fastenc import extension
from fastenc.benchmark import gemm_pack


@pytest.mark.parametrize("layers", [1, 3])
def test_measure_cycles_through_layers(layers):
    extension.load()
    with torch.no_grad():
        row = gemm_pack.measure(40, 56, 5, rounds=2, layers=layers)
    assert row["layers"] == layers and row["calls_per_sample"] % layers == 0
    for name in ("plain", "packed", "panels", "panels-acc"):
        assert row[f"{name}_ms"] > 0, name
    assert row["max_rel_diff"] < 1e-5 and "best/panels" in row


def test_measure_rejects_no_layers():
    with pytest.raises(ValueError, match="gemm_pack: layers must be >= 1, got 0"):
        gemm_pack.measure(40, 56, 5, rounds=2, layers=0)
