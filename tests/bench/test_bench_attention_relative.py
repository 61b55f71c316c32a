"""`fastenc bench attention-relative` at tiny sizes: the JSON a reader relies on (commit, machine, versions, paired
ratios with their spread, the three targets), the DeBERTa check against transformers that ran and is small (and
fails when the two sides differ), the bias rows held to the reference, and bad selections refused."""
from __future__ import annotations

import json
import math

import pytest
import torch

from fastenc import cli
from fastenc.benchmark import attention_relative
from fastenc.benchmark.attention_relative_cases import Sizes, deberta_case

pytest.importorskip("transformers")

# odd sizes: head_dim 16, a length-1 sequence, 8 log buckets reached by the 29-token one
TINY = Sizes(hidden=48, heads=3, position_buckets=8, max_relative_positions=20, lengths=(5, 17, 1, 29),
             bias_batch=3, bias_seq=19, memory_tokens=67)


def _spread(r: dict) -> None:
    assert 0 < r["q20"] <= r["median"] <= r["q80"] and math.isfinite(r["q80"]), r


def test_attention_relative_json(tmp_path, capsys):
    res = attention_relative.run(tmp_path, TINY, quick=True, repeats=3, fresh_process=False, plots=False)
    assert res["failures"] == []
    data = json.loads((tmp_path / f"attention-relative-fp32-t{torch.get_num_threads()}.json").read_text())
    assert data["benchmark"] == "attention-relative" and data["commit"] and data["machine"]["cpu"]
    assert data["versions"]["torch"] == torch.__version__ and data["dtype"] == "float32"
    assert data["sizes"]["lengths"] == [5, 17, 1, 29]

    deb = data["deberta"]
    assert deb["tokens"] == 52 and deb["padded_tokens"] == 4 * 29
    check = deb["check"]
    assert check["ok"] and check["out_max_err"] <= check["out_tolerance"] <= 1e-4 * max(1.0, check["out_scale"])
    assert check["grad_max_rel_err"] < 1e-5
    assert set(check["grad_rel_err"]) == {"x", "Wqkv.weight", "Wqkv.bias", "rel_embeddings", "rel_norm.weight",
                                          "rel_norm.bias"}
    _spread(deb["transformers_over_fastenc"])
    assert deb["transformers_over_fastenc"]["rounds"] >= 3
    assert set(deb["times_ms"]) == {"fastenc", "transformers"}

    rows = {r["case"]: r for r in data["bias"]}
    assert set(rows) == {"bias-mpnet-fwd", "bias-mpnet-fwd+bwd", "bias-deberta-fwd", "bias-deberta-fwd+bwd"}
    for name, r in rows.items():
        assert r["check_ok"] and r["check_max_err"] <= r["check_tolerance"], name
        _spread(r["relative_over_plain"])
        assert r["times_ms"]["plain"]["n"] >= 3
    assert rows["bias-mpnet-fwd"]["num_buckets"] == 32 and rows["bias-deberta-fwd"]["rel_span"] == 8

    mem = data["memory"]
    assert mem["tokens"] == 67 and mem["method"]
    assert mem["fastenc_over_transformers"] == pytest.approx(mem["fastenc_mib"] / mem["transformers_mib"])

    targets = data["targets"]
    assert set(targets) == {"deberta", "bias", "memory"}
    assert (targets["deberta"]["op"], targets["deberta"]["target"]) == (">=", 3.0)
    assert (targets["bias"]["op"], targets["bias"]["target"]) == ("<=", 1.15)
    assert (targets["memory"]["op"], targets["memory"]["target"]) == ("<", 0.05)
    assert targets["bias"]["median"] == max(r["relative_over_plain"]["median"] for c, r in rows.items()
                                            if c.startswith("bias-mpnet"))
    assert set(targets["bias"]["rows"]) == set(rows)  # the DeBERTa rows reported beside it
    for t in targets.values():
        assert isinstance(t["met"], bool)
    out = capsys.readouterr().out
    assert all(f"target {p}:" in out for p in ("deberta", "bias", "memory"))


def test_deberta_check_fails_when_the_sides_differ():
    case = deberta_case(TINY)
    assert case.check()["ok"]
    with torch.no_grad():
        case.pair.fe.Wqkv.bias[2 * TINY.hidden] += 1e-2  # one value-projection bias of fastenc's side
    check = case.check()
    assert not check["ok"] and check["out_max_err"] > check["out_tolerance"]


def test_attention_relative_bad_selection(tmp_path, capsys):
    assert cli.main(["bench", "attention-relative", "--parts", "deberta,softmax", "--out", str(tmp_path)]) == 2
    assert "unknown part(s) ['softmax']" in capsys.readouterr().err
    assert cli.main(["bench", "attention-relative", "--dtype", "bf16", "--out", str(tmp_path)]) == 2
    assert "CPU fp32 only" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown field"):
        Sizes.from_dict({"hidden": 48, "layers": 2})
