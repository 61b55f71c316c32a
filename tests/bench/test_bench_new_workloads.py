"""`fastenc bench models`' base configs and workloads of the GTE / NomicBERT / DINOv2 / CLIP entries (the long text,
the captions), end to end on tiny models through the CLI (the JSON a reader relies on); `fastenc bench retrieval`
(SPLADE and ColBERT) on tiny models."""
from __future__ import annotations

import json
import math

import pytest
import torch

from fastenc import cli
from fastenc.benchmark import hub_sizes, model_workloads, models, retrieval
from fastenc.models import architecture

transformers = pytest.importorskip("transformers")


def _cfg(mt):
    return models.hf_config(architecture.get(mt))


def test_base_configs_are_the_checkpoints_sizes():
    gte, nomic = _cfg("gte"), _cfg("nomic_bert")
    for c, inter in ((gte, 3072), (nomic, 3072)):
        assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.intermediate_size) == (768, 12, 12, inter)
        assert c.vocab_size == 30528 and c.max_position_embeddings == 8192
    assert gte.type_vocab_size == 0 and gte.rope_parameters["rope_type"] == "linear"
    assert gte.rope_parameters["rope_theta"] == 500000 * 2  # fixed NTK x2 as linear RoPE (hub_configs)
    assert nomic.rope_parameters["rope_theta"] == 1000 and nomic.hidden_act == "silu"
    dino, clip_v, clip_t = _cfg("dinov2"), _cfg("clip_vision_model"), _cfg("clip_text_model")
    assert (dino.image_size, dino.patch_size) == (224, 14) and (clip_v.image_size, clip_v.patch_size) == (224, 16)
    assert (clip_t.hidden_size, clip_t.num_hidden_layers, clip_t.num_attention_heads,
            clip_t.max_position_embeddings) == (512, 12, 8, 77)
    for name in ("gte-base", "nomic-bert-base", "dinov2-base", "clip-vit-b16", "clip-text-b16"):
        assert name in models.MODELS


def _text_spec(name="t"):
    return models.ModelSpec(name, "text", lambda: None, "test")


def test_workloads_follow_the_models_positions(monkeypatch):
    monkeypatch.setattr(model_workloads, "LONG_TOKENS", 300)
    spec = _text_spec()
    clip = {}
    loads = model_workloads.workloads(spec, 2000, positions=77, not_run=clip)
    assert set(loads) == {"latency", "latency-1x16", "captions"} and set(clip) == {"fixed", "varlen"}
    ids = loads["captions"][0]["attention_mask"]
    lens = ids.sum(1).tolist()
    assert len(lens) == 32 and all(5 <= n <= 77 for n in lens) and lens == model_workloads.caption_lengths()
    assert loads["captions"][1] == sum(lens) and loads["latency"][1] == 77
    assert set(model_workloads.workloads(spec, 2000, positions=512, quick=True)) == {"latency", "latency-1x16", "fixed",
                                                                             "varlen"}
    long = model_workloads.workloads(spec, 2000, positions=512)  # the long text fits: a default, except with quick
    assert set(long) == {"latency", "latency-1x16", "fixed", "varlen", "long"}
    assert long["long"][0]["input_ids"].shape == (1, 300) and long["long"][1] == 300
    assert "long" not in model_workloads.workloads(spec, 2000, positions=299)
    why = {}
    assert "long" not in model_workloads.workloads(spec, 2000, positions=299, only=["long"], not_run=why)
    assert "exceeds the model's 299 positions" in why["long"]
    # long-2k: asked for only; any length where the model has no absolute positions (positions=None)
    assert "long-2k" not in model_workloads.workloads(spec, 2000, positions=None)
    two = model_workloads.workloads(spec, 2000, positions=None, only=["long-2k"])
    assert two["long-2k"][0]["input_ids"].shape == (1, 2048) and two["long-2k"][1] == 2048
    assert int(two["long-2k"][0]["attention_mask"].sum()) == 2048
    why = {}
    assert "long-2k" not in model_workloads.workloads(spec, 2000, positions=512, only=["long-2k"], not_run=why)
    assert "exceeds the model's 512 positions" in why["long-2k"]
    vis = model_workloads.workloads(models.ModelSpec("v", "vision", lambda: None, ""), 0, image_size=56)
    assert vis["fixed"][0]["pixel_values"].shape == (8, 3, 56, 56)


def _tiny_gte():
    torch.manual_seed(0)
    d = dict(hub_sizes.GTE_BASE_EN_V15, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=96, vocab_size=1500, max_position_embeddings=512)
    return transformers.GteModel(transformers.GteConfig(**hub_sizes.hub_sizes(d)))


def _tiny_clip_text():
    torch.manual_seed(0)
    return transformers.CLIPTextModel(transformers.CLIPTextConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, vocab_size=1500,
        max_position_embeddings=77))


def test_models_cli_long_and_captions(tmp_path, monkeypatch):
    monkeypatch.setattr(model_workloads, "LONG_TOKENS", 400)
    monkeypatch.setitem(models.MODELS, "gte-tiny", models.ModelSpec("gte-tiny", "text", _tiny_gte, "tiny", "gte"))
    monkeypatch.setitem(models.MODELS, "clip-text-tiny",
                        models.ModelSpec("clip-text-tiny", "text", _tiny_clip_text, "tiny", "clip_text_model"))
    rc = cli.main(["bench", "models", "--quick", "--models", "gte-tiny,clip-text-tiny", "--same-process",
                   "--providers", "fastenc,hf-sdpa", "--workloads", "long,captions,fixed", "--rounds", "2",
                   "--no-plots", "--device", "cpu", "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "models.json").read_text())
    assert data["failures"] == [] and "long" in data["workloads"] and "captions" in data["workloads"]
    got = {(r["model"], r["workload"], r["provider"]) for r in data["rows"]}
    assert {("gte-tiny", w, p) for w in ("long", "captions", "fixed") for p in ("fastenc", "hf-sdpa")} <= got
    assert {("clip-text-tiny", w, p) for w in ("captions",) for p in ("fastenc", "hf-sdpa")} <= got
    assert not any(m == "clip-text-tiny" and w in ("fixed", "long") for m, w, _ in got)
    res = {r["model"]: r for r in data["models"]}
    assert set(res["clip-text-tiny"]["workloads_not_run"]) == {"fixed", "long"}
    assert res["gte-tiny"]["errors"]["fastenc"] < 1e-4 and res["clip-text-tiny"]["errors"]["fastenc"] < 1e-4
    for r in data["rows"]:
        if r["provider"] == "fastenc":
            assert math.isfinite(r["paired_ratio_vs_hf-sdpa"]) and r["paired_ratio_vs_hf-sdpa"] > 0
    long = next(r for r in data["rows"] if r["workload"] == "long" and r["provider"] == "fastenc")
    assert long["useful_units"] == 400 and long["workload_desc"] == "1 x 400 tokens"
    lat = {r["model"]: r for r in data["latency_rows"] if r["workload"] == "latency"}
    assert lat["clip-text-tiny"]["workload_desc"] == "1 x 77 tokens"


def test_models_cli_refuses_unknown_workload(tmp_path, capsys):
    rc = cli.main(["bench", "models", "--quick", "--models", "bert-base", "--workloads", "longest",
                   "--out", str(tmp_path)])
    assert rc == 2 and "--workloads: unknown ['longest']" in capsys.readouterr().err


def _tiny_retrieval(monkeypatch):
    small = dict(hidden_size=48, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, vocab_size=3001)
    monkeypatch.setattr(retrieval, "_models", lambda: {
        "splade": lambda: transformers.BertForMaskedLM(transformers.BertConfig(**small)),
        "colbert": lambda: transformers.BertModel(transformers.BertConfig(**small), add_pooling_layer=False)})
    monkeypatch.setattr(retrieval, "COLBERT_DIM", 16)


def test_retrieval_json(tmp_path, monkeypatch, capsys):
    _tiny_retrieval(monkeypatch)
    rc = cli.main(["bench", "retrieval", "--repeats", "2", "--device", "cpu", "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "retrieval.json").read_text())
    assert data["benchmark"] == "retrieval" and data["commit"] and data["machine"]["cpu"]
    res = {r["case"]: r for r in data["results"]}
    assert set(res) == {"splade", "colbert"}
    sp, cb = res["splade"], res["colbert"]
    assert sp["max_abs_err_vs_dense_logits"] < 1e-3 and sp["tokens"] == 8 * 128
    assert sp["logits_mib"] == pytest.approx(8 * 128 * 3001 * 4 / 2**20)
    assert math.isfinite(sp["head_peak_over_logits"]) and sp["head_peak_extra_mib"] >= 0
    for r, key in ((sp, "sparse_over_encoder"), (sp, "sparse_head_over_encoder"), (cb, "multi_vector_over_dense")):
        q = r[key]
        assert 0 < q["q20"] <= q["median"] <= q["q80"] and math.isfinite(q["q80"]), key
        assert all(t["n"] == 2 for t in r["times_ms"].values())
    assert cb["vectors"] == [8 * 128, 16] and cb["targets"]["multi_vector_over_dense"] == 1.05
    out = capsys.readouterr().out
    assert "x encoder" in out and "output='multi_vector'" in out


def test_retrieval_refuses_unknown_case(tmp_path, capsys):
    rc = cli.main(["bench", "retrieval", "--models", "dpr", "--out", str(tmp_path)])
    assert rc == 2 and "unknown ['dpr']" in capsys.readouterr().err
