"""The corpus job on Ray Data (a local Ray instance, 2 CPUs): same ids and embeddings as the in-process job."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import fastenc
from fastenc.corpus.readers import BadRowError

ray = pytest.importorskip("ray")
pq = pytest.importorskip("pyarrow.parquet")


# The instance belongs to a child process and the tests connect to it as to a cluster: a test process that started
# the instance itself would, at ray.shutdown(), have its raylet killed under its own driver, which Ray can answer by
# ending the process with status 1 (seen once: the whole test run ended at this module's teardown).
HEAD = ("import sys, ray; info = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False); "
        "print(info.address_info['gcs_address'], flush=True); sys.stdin.read(); ray.shutdown()")


@pytest.fixture(scope="module")
def ray_local():
    # without token authentication (this process, connecting by address, would not present the token a new local
    # instance makes by default); the instance lives for this module only
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    head = subprocess.Popen([sys.executable, "-c", HEAD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=env)
    try:
        address = head.stdout.readline().strip()
        assert address, f"the Ray head process ended with status {head.wait()}"
        ray.init(address=address, log_to_driver=False)
        yield
        ray.shutdown()
    finally:
        head.stdin.close()  # the head shuts its instance down when its standard input ends
        try:
            head.wait(timeout=120)
        except subprocess.TimeoutExpired:
            head.kill()


def _table(path):
    t = pq.read_table(path)
    return t.column("id").to_pylist(), np.stack(t.column("embedding").to_pylist())


def test_ray_matches_local_job(tmp_path, texts, ray_local):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("\n".join(texts[:23]) + "\n")
    (corpus / "b.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[23:40]))
    local = fastenc.embed(str(corpus), out=tmp_path / "local.parquet", window=16)
    s = fastenc.embed(str(corpus), out=tmp_path / "ray.parquet", engine="ray", actors=1, window=16)
    assert (s.texts, s.skipped) == (local.texts, 0) == (40, 0)
    assert s.tokens == local.tokens and s.truncated == local.truncated
    ids_l, emb_l = _table(tmp_path / "local.parquet")
    ids_r, emb_r = _table(tmp_path / "ray.parquet")
    # each file is read in blocks of 16 rows; the output keeps the input order
    assert ids_r == ids_l == [f"a.txt:{i}" for i in range(23)] + [f"b.jsonl:{i}" for i in range(17)]
    np.testing.assert_allclose(emb_r, emb_l, atol=2e-6, rtol=0)


def _shard_rows(out):
    return [s["rows_read"] for s in json.loads((out / "_manifest.json").read_text())["shards"]]


def test_ray_two_actors_share_one_file(tmp_path, texts, ray_local):
    """One file in blocks of 8 rows over two actors: the same ids, embeddings, shards and bad rows as in process."""
    lines = texts[:37] + [""] + texts[37:]  # a bad row (37) in the fifth block
    path = tmp_path / "one.txt"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(BadRowError, match=r"bad row 37 of .*one.txt: empty text"):
        fastenc.embed(str(path), out=tmp_path / "err.parquet", engine="ray", actors=2, window=8)
    kw = dict(window=8, on_bad="skip")
    local = fastenc.embed(str(path), out=tmp_path / "local.parquet", **kw)
    s = fastenc.embed(str(path), out=tmp_path / "ray.parquet", engine="ray", actors=2, **kw)
    assert (s.texts, s.skipped, s.tokens, s.truncated) == (local.texts, 1, local.tokens, local.truncated)
    assert s.texts == len(texts) and s.bad == local.bad == [(str(path), 37, "empty text")]
    ids_l, emb_l = _table(tmp_path / "local.parquet")
    ids_r, emb_r = _table(tmp_path / "ray.parquet")
    assert ids_r == ids_l == [i for i in range(len(lines)) if i != 37]
    np.testing.assert_allclose(emb_r, emb_l, atol=2e-6, rtol=0)
    assert _shard_rows(tmp_path / "ray.parquet") == _shard_rows(tmp_path / "local.parquet") == [8] * 7 + [5]


def test_ray_bad_rows(tmp_path, ray_local):
    path = tmp_path / "in.txt"
    path.write_text("fine\n\nalso fine\n")
    with pytest.raises(BadRowError, match="bad row 1 of .*in.txt: empty text"):
        fastenc.embed(str(path), out=tmp_path / "o.parquet", engine="ray")
    s = fastenc.embed(str(path), out=tmp_path / "o.parquet", engine="ray", on_bad="skip", overwrite=True)
    assert (s.texts, s.skipped) == (2, 1)
    ids, _ = _table(tmp_path / "o.parquet")
    assert sorted(ids) == [0, 2]


def test_ray_names_first_bad_row(tmp_path, texts, ray_local):
    """Several bad rows in different blocks (read by concurrent tasks): the error names the first in input order, the
    same file and row as the in-process job, and leaves no output behind."""
    lines = list(texts[:40])
    for i in (7, 8, 16, 24, 33):  # the last row of block 0, then the first rows of blocks 1-3 and one in block 4
        lines[i] = ""
    (tmp_path / "a.txt").write_text("fine\n" * 3)
    path = tmp_path / "b.txt"
    path.write_text("\n".join(lines) + "\n")
    inputs = [tmp_path / "a.txt", path]
    with pytest.raises(BadRowError) as local:
        fastenc.embed(inputs, out=tmp_path / "local.parquet", window=8)
    with pytest.raises(BadRowError) as on_ray:
        fastenc.embed(inputs, out=tmp_path / "ray.parquet", engine="ray", actors=2, window=8)
    assert str(on_ray.value) == str(local.value)
    assert f"bad row 7 of {path}: empty text" in str(on_ray.value)
    assert not list(tmp_path.glob("*.parquet*"))


def test_ray_argument_errors(tmp_path):
    (tmp_path / "in.txt").write_text("a\n")
    with pytest.raises(ValueError, match="out must end in .parquet"):
        fastenc.embed(str(tmp_path / "in.txt"), out=tmp_path / "o.npy", engine="ray")
    with pytest.raises(ValueError, match="give out="):
        fastenc.embed(str(tmp_path / "in.txt"), engine="ray")
    with pytest.raises(ValueError, match="actors must be a positive int"):
        fastenc.embed(str(tmp_path / "in.txt"), out=tmp_path / "o.parquet", engine="ray", actors=0)
    with pytest.raises(ValueError, match="engine must be one of"):
        fastenc.embed(["a"], engine="spark")
