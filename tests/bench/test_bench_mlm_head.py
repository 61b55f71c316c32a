"""`fastenc bench mlm-head` on tiny models: the JSON a reader relies on (commit, machine, paired ratios with their
spread, 15% of the tokens predicted) and a bad --models selection refused with exit code 2."""
from __future__ import annotations

import json
import math

import transformers

from fastenc import cli
from fastenc.benchmark import mlm_head


def _tiny(monkeypatch):
    small = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=48, vocab_size=500)
    makers = {"bert-base": lambda: transformers.BertForMaskedLM(transformers.BertConfig(**small)),
              "modernbert-base": lambda: transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(
                  **small, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2))}
    monkeypatch.setattr(mlm_head, "_models", lambda names: {n: makers[n] for n in names})


def test_mlm_head_json(tmp_path, monkeypatch, capsys):
    _tiny(monkeypatch)
    rc = cli.main(["bench", "mlm-head", "--repeats", "3", "--models", "modernbert-base,bert-base", "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "mlm_head.json").read_text())
    assert data["commit"] and data["machine"]["cpu"] and data["benchmark"] == "mlm-head"
    assert [r["model"] for r in data["results"]] == ["modernbert-base", "bert-base"]
    for r in data["results"]:
        assert 0.1 * 8 * 128 < r["predicted_tokens"] < 0.2 * 8 * 128
        for key in ("sparse_head_over_encoder", "hf_dense_head_over_sparse_head", "hf_dense_head_over_one_layer"):
            q = r[key]
            assert 0 < q["q20"] <= q["median"] <= q["q80"] and math.isfinite(q["q80"]), (r["model"], key)
        assert set(r["times_ms"]) == {"fe-encoder", "fe-encoder+sparse", "fe-sparse-head", "hf-dense-head", "hf-mlm"}
        assert all(t["n"] == 3 for t in r["times_ms"].values())
    assert "x encoder" in capsys.readouterr().out


def test_mlm_head_unknown_model(tmp_path, capsys):
    rc = cli.main(["bench", "mlm-head", "--models", "gpt2", "--out", str(tmp_path)])
    assert rc == 2 and "unknown model(s) ['gpt2']" in capsys.readouterr().err
