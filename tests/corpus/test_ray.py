"""The corpus job on Ray Data (a local Ray instance, 2 CPUs): same ids and embeddings as the in-process job."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import fastenc
from fastenc.corpus.job import Summary
from fastenc.corpus.readers import BadRowError

ray = pytest.importorskip("ray")
pq = pytest.importorskip("pyarrow.parquet")


# Ray runs outside the test process: the instance belongs to one child process (the head) and the jobs run in
# another (the driver), which connects to it as to a cluster. A test process that is itself a Ray driver keeps Ray's
# threads after ray.shutdown() (Ray Data's metrics poller among them), and its core worker ends the whole process
# with status 1 when it loses the raylet or the GCS: a driver in this process made the test run end at this module's
# teardown, with no report.
HEAD = ("import sys, ray; info = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False); "
        "print(info.address_info['gcs_address'], flush=True); sys.stdin.read(); ray.shutdown()")
# The driver: one fastenc.embed call per request line {"inputs", "kwargs"}; one reply line per request, the job's
# Summary or the exception's type and message.
DRIVER = """
import dataclasses, json, sys
import ray
import fastenc
ray.init(address=sys.argv[1], log_to_driver=False)
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    try:
        s = fastenc.embed(req["inputs"], **req["kwargs"])
        reply = {"summary": dataclasses.asdict(s)}
    except Exception as e:
        reply = {"error": type(e).__name__, "message": str(e)}
    print(json.dumps(reply), flush=True)
ray.shutdown()
"""
ERRORS = {"BadRowError": BadRowError, "ValueError": ValueError}


class RayDriver:
    """fastenc.embed(..., engine="ray") run by the driver process; raises the job's error here, by type and message."""

    def __init__(self, proc):
        self.proc = proc

    def embed(self, inputs, **kwargs):
        inputs = [str(i) for i in inputs] if isinstance(inputs, (list, tuple)) else str(inputs)
        kwargs = {k: str(v) if k == "out" else v for k, v in kwargs.items()}
        self.proc.stdin.write(json.dumps({"inputs": inputs, "kwargs": {**kwargs, "engine": "ray"}}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the Ray driver process ended with status {self.proc.wait()}"
        reply = json.loads(line)
        if "error" in reply:
            raise ERRORS.get(reply["error"], RuntimeError)(reply["message"])
        s = Summary(**reply["summary"])
        s.bad = [tuple(b) for b in s.bad]
        return s


def _close(proc):
    proc.stdin.close()  # each process shuts Ray down when its standard input ends
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="module")
def ray_local():
    # without token authentication (the driver, connecting by address, would not present the token a new local
    # instance makes by default); the instance lives for this module only
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    head = subprocess.Popen([sys.executable, "-c", HEAD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=env)
    try:
        address = head.stdout.readline().strip()
        assert address, f"the Ray head process ended with status {head.wait()}"
        driver = subprocess.Popen([sys.executable, "-c", DRIVER, address], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=env)
        try:
            assert driver.stdout.readline(), f"the Ray driver process ended with status {driver.wait()}"
            yield RayDriver(driver)
            assert not ray.is_initialized(), "Ray started in the test process"
        finally:
            _close(driver)
    finally:
        _close(head)


def _table(path):
    t = pq.read_table(path)
    return t.column("id").to_pylist(), np.stack(t.column("embedding").to_pylist())


def test_ray_matches_local_job(tmp_path, texts, ray_local):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("\n".join(texts[:23]) + "\n")
    (corpus / "b.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[23:40]))
    local = fastenc.embed(str(corpus), out=tmp_path / "local.parquet", window=16)
    s = ray_local.embed(str(corpus), out=tmp_path / "ray.parquet", actors=1, window=16)
    assert (s.texts, s.skipped) == (local.texts, 0) == (40, 0)
    assert s.tokens == local.tokens and s.truncated == local.truncated
    ids_l, emb_l = _table(tmp_path / "local.parquet")
    ids_r, emb_r = _table(tmp_path / "ray.parquet")
    # each file is read in blocks of 16 rows; the output keeps the input order
    assert ids_r == ids_l == [f"a.txt:{i}" for i in range(23)] + [f"b.jsonl:{i}" for i in range(17)]
    np.testing.assert_allclose(emb_r, emb_l, atol=2e-6, rtol=0)


def test_ray_dimensions(tmp_path, texts, ray_local):
    """Matryoshka truncation on Ray: the same columns as the in-process job, recorded in the manifest."""
    src = tmp_path / "a.txt"
    src.write_text("\n".join(texts[:12]) + "\n")
    fastenc.embed(str(src), out=tmp_path / "local.parquet", window=8, dimensions=48)
    ray_local.embed(str(src), out=tmp_path / "ray.parquet", actors=1, window=8, dimensions=48)
    ids_l, emb_l = _table(tmp_path / "local.parquet")
    ids_r, emb_r = _table(tmp_path / "ray.parquet")
    assert ids_r == ids_l and emb_r.shape == (12, 48)
    np.testing.assert_allclose(emb_r, emb_l, atol=2e-6, rtol=0)
    manifest = json.loads((tmp_path / "ray.parquet" / "_manifest.json").read_text())
    assert manifest["params"]["dimensions"] == 48 and manifest["params"]["hidden"] == 48


def _shard_rows(out):
    return [s["rows_read"] for s in json.loads((out / "_manifest.json").read_text())["shards"]]


def test_ray_two_actors_share_one_file(tmp_path, texts, ray_local):
    """One file in blocks of 8 rows over two actors: the same ids, embeddings, shards and bad rows as in process."""
    lines = texts[:37] + [""] + texts[37:]  # a bad row (37) in the fifth block
    path = tmp_path / "one.txt"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(BadRowError, match=r"bad row 37 of .*one.txt: empty text"):
        ray_local.embed(str(path), out=tmp_path / "err.parquet", actors=2, window=8)
    kw = dict(window=8, on_bad="skip")
    local = fastenc.embed(str(path), out=tmp_path / "local.parquet", **kw)
    s = ray_local.embed(str(path), out=tmp_path / "ray.parquet", actors=2, **kw)
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
        ray_local.embed(str(path), out=tmp_path / "o.parquet")
    s = ray_local.embed(str(path), out=tmp_path / "o.parquet", on_bad="skip", overwrite=True)
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
        ray_local.embed(inputs, out=tmp_path / "ray.parquet", actors=2, window=8)
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
    assert not ray.is_initialized()  # each error came before Ray would start
