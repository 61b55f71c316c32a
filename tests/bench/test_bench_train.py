"""`fastenc bench train --quick`: tiny BERT, full fine-tuning against transformers sdpa and LoRA against
transformers + PEFT, end to end through the CLI; the JSON/CSV fields a reader relies on; bad selections."""
from __future__ import annotations

import csv
import json
import math

from fastenc import cli
from fastenc.benchmark.ops._common import varlen_lengths


def test_train_cli_quick(tmp_path):
    rc = cli.main(["bench", "train", "--quick", "--repeats", "1", "--no-plots", "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "train.json").read_text())
    assert data["attention_dropout"] == "config"
    assert data["optimizer"] == "adamw_torch_fused" and data["optimizer_kwargs"] == {"fused": True}  # Trainer's
    assert data["suite"] == "train" and data["commit"] and data["machine"]["cpu"] and "RSS" in data["memory"]
    rows = {(r["mode"], r["workload"], r["provider"]): r for r in data["rows"]}
    want = {(m, w, p) for w in ("fixed", "varlen") for m, ps in (("full", ("fastenc", "hf-sdpa")),
                                                                  ("lora", ("fastenc", "hf-sdpa+peft"))) for p in ps}
    assert set(rows) == want, sorted(rows)
    for (mode, w, p), r in rows.items():
        assert r["model"] == "bert-base" and r["unit"] == "tokens/s" and r["n"] == 1
        assert r["attention_dropout_p"] == 0.1  # BERT's own config: the step users train
        assert math.isfinite(r["throughput"]) and r["throughput"] > 0 and r["peak_mem_mib"] is not None
        assert r["max_abs_err_logits"] < 1e-4, (mode, w, p, r["max_abs_err_logits"])  # the same model on both sides
        if p == "fastenc":
            base = "hf-sdpa" if mode == "full" else "hf-sdpa+peft"
            assert math.isfinite(r[f"paired_ratio_vs_{base}"]) and r[f"paired_ratio_vs_{base}"] > 0
    assert rows[("full", "varlen", "fastenc")]["useful_units"] == sum(varlen_lengths(n=4, hi=64))  # real tokens
    with (tmp_path / "train.csv").open() as f:
        assert len(list(csv.DictReader(f))) == len(data["rows"])


def test_train_cli_bad_selection(tmp_path, capsys):
    assert cli.main(["bench", "train", "--quick", "--models", "gpt2", "--out", str(tmp_path)]) == 2
    assert "--models: unknown ['gpt2']" in capsys.readouterr().err
    assert cli.main(["bench", "train", "--quick", "--modes", "qlora", "--out", str(tmp_path)]) == 2
    assert "--modes: must be among ['full', 'lora']" in capsys.readouterr().err
    assert cli.main(["bench", "train", "--quick", "--attention-dropout", "0.2", "--out", str(tmp_path)]) == 2
    assert "--attention-dropout: must be 'config' or 'off', got '0.2'" in capsys.readouterr().err
    assert cli.main(["bench", "train", "--quick", "--workloads", "fixed,latency", "--out", str(tmp_path)]) == 2
    assert "--workloads: unknown ['latency']; known for train: fixed, varlen" in capsys.readouterr().err
    assert cli.main(["bench", "train", "--quick", "--optimizer", "sgd", "--out", str(tmp_path)]) == 2
    assert "--optimizer: must be one of ['adamw_torch_fused', 'adamw_torch'], got 'sgd'" in capsys.readouterr().err


def test_train_cli_runs_the_workloads_asked_for(tmp_path):
    rc = cli.main(["bench", "train", "--quick", "--repeats", "1", "--no-plots", "--modes", "full", "--workloads",
                   "varlen", "--optimizer", "adamw_torch", "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "train.json").read_text())
    assert data["optimizer"] == "adamw_torch" and data["optimizer_kwargs"] == {}
    assert data["workloads"] == ["varlen"]
    assert {(r["mode"], r["workload"]) for r in data["rows"]} == {("full", "varlen")}
    assert {r["provider"] for r in data["rows"]} == {"fastenc", "hf-sdpa"}


def test_attention_dropout_off_builds_every_model_without_it():
    from fastenc.benchmark.train import DEFAULT_MODELS, attention_dropout_key, build_hf

    keys = {}
    for name in DEFAULT_MODELS:
        cfg = build_hf(name, True, "off").config
        keys[name] = attention_dropout_key(cfg)
        assert getattr(cfg, keys[name]) == 0.0
    assert keys == {"bert-base": "attention_probs_dropout_prob", "modernbert-base": "attention_dropout",
                    "vit-b16": "attention_probs_dropout_prob"}
    assert build_hf("bert-base", True).config.attention_probs_dropout_prob == 0.1
    assert build_hf("bert-base", True, "off").config.hidden_dropout_prob == 0.1  # the other dropouts stay


def test_train_breakdown_gives_the_gemm_floor_and_ceiling(tmp_path):
    """--breakdown: one profiled step of fastenc and of the baseline, their GEMMs found with shapes and FLOPs and
    timed alone; fastenc's floor is the least of its GEMMs alone and in the step, the ceiling ratio the baseline's
    median over that floor."""
    rc = cli.main(["bench", "train", "--quick", "--repeats", "1", "--no-plots", "--modes", "full", "--workloads",
                   "fixed", "--breakdown", "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "train.json").read_text())
    assert data["breakdown"] is True
    rows = {r["provider"]: r for r in data["rows"]}
    ours, base = rows["fastenc"], rows["hf-sdpa"]
    for r in (ours, base):
        b = r["breakdown"]
        assert b["gemm_ms"] > 0 and b["gemm_gflop"] > 0 and b["gemm_shapes"]
        # a training step of a 2-layer classifier: forward, input- and weight-gradient GEMMs of every linear
        assert sum(b["gemm_shapes"].values()) >= 3 * 2 * 4
        assert all(b[f"gemm_alone_{k}_ms"] > 0 for k in ("plain", "packed", "panels"))
    bd = ours["breakdown"]
    floor = min(bd["gemm_ms"], *(bd[f"gemm_alone_{k}_ms"] for k in ("plain", "packed", "panels")))
    assert ours["gemm_floor_ms"] == floor
    assert math.isclose(ours["ceiling_ratio_vs_hf-sdpa"], base["median_ms"] / floor)
    assert "ceiling_ratio_vs_hf-sdpa" not in base


def test_train_models_run_one_process_each(tmp_path):
    """Two models: each in a fresh process (fastenc.benchmark.isolated), their rows gathered in one file."""
    rc = cli.main(["bench", "train", "--quick", "--models", "bert-base,vit-b16", "--modes", "full", "--workloads",
                   "fixed", "--repeats", "1", "--no-plots", "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "train.json").read_text())
    assert data["process_per_model"] is True and data["complete"]
    assert {(r["model"], r["provider"]) for r in data["rows"]} == {
        (m, p) for m in ("bert-base", "vit-b16") for p in ("fastenc", "hf-sdpa")}
    assert all(r["max_abs_err_logits"] < 1e-4 and r["throughput"] > 0 for r in data["rows"])
