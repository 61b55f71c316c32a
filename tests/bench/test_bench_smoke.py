"""Smoke test of the benchmark harness (`fastenc bench`): one small kernel case end to end through the CLI,
the JSON/CSV fields a reader relies on, finite ratios; the FLOPs model; the ONNX Runtime verification gate."""
from __future__ import annotations

import csv
import importlib.util
import json
import math

import pytest
import torch

from fastenc import cli
from fastenc.benchmark import kernels, models, timing
from fastenc.benchmark.ops import attention as attention_spec


def test_kernels_cli_one_case(tmp_path):
    rc = cli.main(["bench", "kernels", "--quick", "--device", "cpu", "--ops", "layer_norm",
                   "--providers", "reference,cpu,triton,torch-eager", "--no-compile", "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "kernels.json").read_text())
    assert data["suite"] == "kernels" and data["device"] == "cpu" and data["dtype"] == "float32"
    assert data["machine"]["cpu"] and data["machine"]["threads"] == torch.get_num_threads()
    assert data["versions"]["torch"] == torch.__version__ and data["commit"]
    for c in ("copy_bandwidth", "gemm_rate"):
        assert math.isfinite(data["ceilings"][c]["value"]) and data["ceilings"][c]["value"] > 0
    timed = {r["provider"]: r for r in data["rows"] if "median_ms" in r}
    assert {"fastenc-reference", "fastenc-cpu", "torch-eager"} <= set(timed), sorted(timed)
    for r in timed.values():
        assert r["op"] == "layer_norm" and r["bytes"] > 0 and r["flops"] > 0
        for k in ("median_ms", "q20_ms", "q80_ms", "gb_s", "frac_of_ceiling", "speedup_vs_eager"):
            assert math.isfinite(r[k]) and r[k] > 0, (r["provider"], k, r[k])
        assert r["q20_ms"] <= r["median_ms"] <= r["q80_ms"]
        assert r["max_abs_err_vs_reference"] < 1e-4  # every provider computed the same thing
    assert timed["torch-eager"]["speedup_vs_eager"] == pytest.approx(1.0)
    skipped = {r["provider"]: r["skipped"] for r in data["rows"] if "skipped" in r}
    assert "interpreter" in skipped["fastenc-triton"]  # triton on CPU is named, not silently dropped
    with (tmp_path / "kernels.csv").open() as f:
        assert len(list(csv.DictReader(f))) == len(data["rows"])
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "kernels_roofline.png").stat().st_size > 0
        assert (tmp_path / "kernels_throughput.png").stat().st_size > 0


def test_kernels_dropout_case_makes_the_references_mask(tmp_path):
    """dropout in `bench kernels`: every fastenc backend draws its (seed, offset) alike, so each output is the
    reference's mask, held to the tolerance rule; torch's F.dropout (its own mask) is timed beside them."""
    rc = cli.main(["bench", "kernels", "--quick", "--device", "cpu", "--ops", "dropout", "--no-plots",
                   "--out", str(tmp_path)])
    assert rc == 0
    rows = json.loads((tmp_path / "kernels.json").read_text())["rows"]
    timed = {r["provider"]: r for r in rows if "median_ms" in r}
    assert {"fastenc-reference", "fastenc-cpu", "torch-eager"} <= set(timed), sorted(timed)
    skipped = {r["provider"]: r["skipped"] for r in rows if "skipped" in r}
    assert "did not finish compiling" in skipped["torch-compile"]
    for name in ("fastenc-reference", "fastenc-cpu"):
        assert timed[name]["within_tolerance"] is True and timed[name]["max_abs_err_vs_ref32"] < 1e-5
    assert timed["torch-eager"]["max_abs_err_vs_reference"] > 0  # another mask, the same cost class
    assert all(r["op"] == "dropout" and r["bytes"] > 0 and r["bound"] == "memory" for r in timed.values())


def test_attention_flops_model_counts_visible_pairs():
    for L in (5, 17, 130):
        for w in (None, 0, 3, 64):
            i = torch.arange(L)
            brute = int(((i[None] - i[:, None]).abs() <= (L if w is None else w)).sum())
            assert attention_spec.visible_pairs([L], w) == brute, (L, w)


def test_varlen_workload_is_fixed():
    lens = kernels.varlen_lengths()
    assert len(lens) == 16 and all(16 <= n <= 384 for n in lens)
    assert lens == kernels.varlen_lengths()


def test_timing_interleaves_and_summarizes():
    order = []
    samples = timing.interleaved({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, warmup=0, repeats=3)
    assert order == ["a", "b", "b", "a", "a", "b"] and all(len(s) == 3 for s in samples.values())
    st = timing.summarize([1.0, 2.0, 3.0, 4.0, 5.0])
    assert (st.median_ms, st.q20_ms, st.q80_ms, st.n) == (3.0, 1.8, 4.2, 5)


def _tiny_spec():
    def build():
        from transformers import BertConfig, BertModel
        torch.manual_seed(0)
        return BertModel(BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                                    vocab_size=2000), add_pooling_layer=False)
    return models.ModelSpec("bert-tiny", "text", build, "tiny test model")


def test_wrong_onnx_baseline_is_not_timed():
    pytest.importorskip("transformers")
    spec = _tiny_spec()
    hf = spec.build().eval()
    good = models._torch_fn(hf)
    fns = {"hf-sdpa": good, "onnxruntime": lambda inp: good(inp) + 2.7}
    skipped: dict = {}
    errs = models.verify(spec, hf, fns, skipped, "cpu")
    assert errs["hf-sdpa"] < 1e-5 and errs["onnxruntime"] > 2
    assert "onnxruntime" not in fns and "not timed" in skipped["onnxruntime"]


def test_tiny_model_end_to_end(monkeypatch):
    """The model harness on a 2-layer BERT: fastenc and ONNX Runtime (when installed: the optimized export with
    attention fused) checked, timed, ratioed."""
    pytest.importorskip("transformers")
    monkeypatch.setenv("FASTENC_BENCH_NO_CACHE", "1")  # a fallback export goes to a temporary folder
    res = models.run_model(_tiny_spec(), "cpu", torch.float32, ["fastenc", "hf-sdpa", "onnxruntime"], quick=True,
                           threads=torch.get_num_threads())
    assert res["errors"]["fastenc"] < 1e-4, res["errors"]
    provs = {r["provider"] for r in res["rows"]}
    if importlib.util.find_spec("onnxruntime") is None or importlib.util.find_spec("onnx") is None:
        assert "onnxruntime" in res["skipped"]
    else:
        assert res["errors"]["onnxruntime"] < models.ORT_TOL and "onnxruntime" in provs
        ort = res["provider_info"]["onnxruntime"]
        assert ort["export"] == "optimized" and ort["fused"]["Attention"] == 2, ort
    assert {r["workload"] for r in res["rows"]} == {"fixed", "varlen"}
    for r in res["rows"]:
        assert math.isfinite(r["throughput"]) and r["throughput"] > 0
        assert r["latency_p50_ms"] <= r["latency_p95_ms"]
        if r["provider"] == "fastenc":
            assert math.isfinite(r["ratio_vs_hf-sdpa"]) and r["ratio_vs_hf-sdpa"] > 0
            lo, hi = r["paired_ratio_vs_hf-sdpa_q20_q80"]
            assert 0 < lo <= r["paired_ratio_vs_hf-sdpa"] <= hi


def test_models_run_one_process_per_model(tmp_path):
    """With several models each runs in a fresh process (fastenc.benchmark.isolated); rows and steps come back."""
    from fastenc.benchmark import model_suite as suite

    steps = []
    res = suite._run_model_isolated("minilm", "cpu", torch.float32, ["fastenc", "hf-sdpa"], True,
                                    torch.get_num_threads(), log=lambda m: None, tick=lambda: None,
                                    step=steps.append)
    assert steps[:2] == ["build", "check outputs"]
    got = {(r["workload"], r["provider"]) for r in res["rows"]}
    assert {("fixed", "fastenc"), ("fixed", "hf-sdpa"), ("varlen", "fastenc")} <= got
    assert res["errors"]["fastenc"] < 1e-4
    with pytest.raises(RuntimeError, match="no-such-model.*KeyError"):
        suite._run_model_isolated("no-such-model", "cpu", torch.float32, ["fastenc"], True, 1,
                                  log=lambda m: None, tick=lambda: None, step=lambda m: None)


def test_paired_ratio_pairs_rounds():
    """A slow round hits both providers: the paired ratio sees 2x in every round, the ratio of medians does not."""
    base = [20.0, 10.0, 30.0, 10.0, 30.0]   # the machine slows down in rounds 0, 2, 4
    fast = [10.0, 5.0, 15.0, 5.0, 15.0]
    assert models.paired_ratio(base, fast) == 2.0
    assert models.paired_ratio([3.0, 1.0], [1.0, 1.0]) == 2.0  # median of 3 and 1
