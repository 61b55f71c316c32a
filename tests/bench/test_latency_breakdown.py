"""The batch-1 breakdown (fastenc.benchmark.latency): every GEMM of a forward is found with its shape, the
categories and the rest add up to the profiled wall time, and the latency rows carry the time ratios."""
from __future__ import annotations

import math

import pytest
import torch

from fastenc.benchmark import latency, models


def test_gemm_shapes_from_profiler_names():
    assert latency._mkn("aten::addmm", [[30], [17, 40], [40, 30], [], []]) == (17, 40, 30)
    assert latency._mkn("aten::addmm_", [[17, 30], [17, 40], [40, 30], [], []]) == (17, 40, 30)
    assert latency._mkn("aten::mm", [[5, 8], [8, 3]]) == (5, 8, 3)
    assert latency._mkn("mkldnn::_linear_pointwise", [[16, 64], [96, 64], [96], [], [], []]) == (16, 64, 96)
    assert latency._mkn("mkldnn::_linear_pointwise", [[16, 64], [16, 96], [96, 64], [], []]) == (16, 64, 96)
    assert latency._mkn("fastenc::gemm_packed 16x384x1152", []) == (16, 384, 1152)
    assert latency._category("fastenc::gemm_packed 16x384x1152") == "gemm"
    assert latency._mkn("aten::mm", [[5, 8]]) is None
    assert latency._mkn("aten::relu", [[5, 8]]) is None
    assert latency._category("fastenc::layer_norm") == "fastenc_ops"
    assert latency._category("mkldnn::_linear_pointwise") == "gemm"
    assert latency._category("aten::index_select") == "other_ops"


def test_breakdown_of_a_forward():
    """A 2-layer BERT at 1 x 20 tokens: 4 GEMMs a layer (the fused q/k/v, out, fc1, fc2) at M = 20."""
    pytest.importorskip("transformers")
    import fastenc
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    hf = BertModel(BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=136,
                              vocab_size=300), add_pooling_layer=False).eval()
    fe = fastenc.from_hf(hf).eval()
    ids = torch.randint(5, 300, (1, 20))

    def call():
        with torch.inference_mode():
            return fe(ids)

    b = latency.breakdown(call, calls=2)
    assert b["gemm_shapes"] == {"20x136x64": 2.0, "20x64x136": 2.0, "20x64x192": 2.0, "20x64x64": 2.0}
    assert math.isclose(b["gemm_gflop"], 2 * 20 * (8 * 64 * 64 + 4 * 64 * 136) / 1e9)
    parts = sum(b[k] for k in ("gemm_ms", "fastenc_ops_ms", "other_ops_ms", "rest_ms"))
    assert math.isclose(parts, b["profiled_wall_ms"]) and b["gemm_ms"] > 0 and b["fastenc_ops_ms"] > 0
    assert b["ops_per_call"] == int(b["ops_per_call"]) and b["ops_per_call"] >= 12   # the same ops each call
    allocs = b["allocations_per_call"]
    assert allocs == int(allocs) and 0 < allocs < b["ops_per_call"]
    alone = latency.gemm_alone(b["gemm_shapes"], rounds=1)
    assert alone["gemm_alone_plain_ms"] > 0 and alone["gemm_alone_panels_ms"] > 0
    line = latency.format_breakdown("tiny", "latency", "fastenc", {**b, **alone}, 1.0)
    assert "gemm" in line and "rest" in line and "allocations a call" in line


def test_latency_row_ratios():
    spec = models.ModelSpec("m", "text", lambda: None, "")
    samples = {"fastenc": [1.0, 2.0, 1.0], "hf-sdpa": [2.0, 2.0, 4.0]}
    row = models._latency_row(spec, "latency", "1 x 128", "fastenc", samples["fastenc"], samples)
    assert row["p50_ms"] == 1.0 and row["time_ratio_vs_hf-sdpa"] == 0.5
    assert row["paired_time_ratio_vs_hf-sdpa"] == 0.5  # per round 0.5, 1.0, 0.25
    assert row["paired_time_ratio_vs_hf-sdpa_q20_q80"][0] < 0.5 < row["paired_time_ratio_vs_hf-sdpa_q20_q80"][1]


def test_throughput_breakdown_floor_and_ceiling():
    """bench models --breakdown on a throughput workload: one profiled call of fastenc and of sdpa, fastenc's GEMMs
    timed alone give its floor; run through _time_workloads the fastenc row gets the ceiling ratio."""
    pytest.importorskip("transformers")
    import fastenc
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    hf = BertModel(BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=136,
                              vocab_size=300), add_pooling_layer=False).eval()
    hf.set_attn_implementation("sdpa")
    fe = fastenc.from_hf(hf).eval()

    def run(m, own):
        def fn(inp):
            with torch.inference_mode():
                return m(inp["input_ids"], inp["attention_mask"]) if own else m(**inp)
        return fn

    fns = {"fastenc": run(fe, True), "hf-sdpa": run(hf, False)}
    ids = torch.randint(5, 300, (3, 24))
    loads = {w: ({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, ids.numel(), w)
             for w in ("latency", "fixed")}
    spec = models.ModelSpec("tiny", "text", lambda: hf, "")
    rows, _, parts = models._time_workloads(spec, fns, loads, "cpu", True, None, lambda m: None, breakdown=True)
    b = parts["fixed"]["fastenc"]
    assert b["gemm_shapes"] == {"72x136x64": 2.0, "72x64x136": 2.0, "72x64x192": 2.0, "72x64x64": 2.0}
    alone = [b[f"gemm_alone_{k}_ms"] for k in ("plain", "packed", "panels")]
    assert b["gemm_floor_ms"] == min(b["gemm_ms"], *alone) > 0
    assert parts["fixed"]["hf-sdpa"]["gemm_gflop"] > 0
    row = {r["provider"]: r for r in rows if r["workload"] == "fixed"}
    assert row["fastenc"]["gemm_floor_ms"] == b["gemm_floor_ms"]
    assert math.isclose(row["fastenc"]["ceiling_ratio_vs_hf-sdpa"], row["hf-sdpa"]["median_ms"] / b["gemm_floor_ms"])
    assert "ceiling_ratio_vs_hf-sdpa" not in row["hf-sdpa"]
    # fastenc's GEMMs alone, timed in the same rounds: a paired ceiling, and no row of their own
    assert set(row) == {"fastenc", "hf-sdpa"}
    f = row["fastenc"]
    assert f["gemms_alone_ms"] > 0 and f["paired_time_over_gemms_alone"] > 0
    lo, hi = f["paired_ceiling_vs_hf-sdpa_q20_q80"]
    assert lo <= f["paired_ceiling_vs_hf-sdpa"] <= hi
    assert "paired_ceiling_vs_hf-sdpa" not in row["hf-sdpa"]


def test_gemm_replay_runs_the_forward_gemms_and_nothing_else():
    shapes = {"9x16x24": 3.0, "9x24x16": 1.0}
    cache: dict = {}
    latency.gemm_alone(shapes, rounds=1, cache=cache)
    cache["9x24x16"] = {"plain": 1.0, "packed": 2.0, "panels": 3.0}  # plain is fastest for this one
    replay = latency.gemm_replay(shapes, cache)
    b = latency.breakdown(replay, calls=2)
    assert b["gemm_shapes"] == shapes
    assert b["fastenc_ops_ms"] == 0 and math.isclose(b["gemm_gflop"], 2 * 9 * 16 * 24 * 4 / 1e9)


def test_gemm_floor_is_the_least_time_the_gemms_were_seen_to_take():
    from fastenc.benchmark.latency import gemm_floor

    b = {"gemm_ms": 90.0, "gemm_alone_plain_ms": 80.0, "gemm_alone_packed_ms": 85.0, "gemm_alone_panels_ms": 70.0}
    assert gemm_floor(b) == 70.0
    # timed alone in a slow stretch of the machine: the GEMMs inside the call bound the floor instead
    b.update(gemm_alone_plain_ms=120.0, gemm_alone_packed_ms=130.0, gemm_alone_panels_ms=125.0)
    assert gemm_floor(b) == 90.0
