"""Every finished output opens with the expected rows: one id column type per output, empty inputs give empty
outputs, byte order marks and row-0 gaps in real files are read, an output inside an input folder is refused, and
a failed write names the folder, the operation and the OS's reason, leaving nothing under a final name."""
import csv
import re
import json
import resource
import signal

import numpy as np
import pytest

import fastenc
from fastenc.corpus import writers
from fastenc.corpus.readers import check_fields, iter_block, iter_records, resolve_sources, split_source

pq = pytest.importorskip("pyarrow.parquet")


def test_folder_ids_with_an_all_skipped_first_window(tmp_path, minilm, texts):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text("".join(json.dumps({"text": ""}) + "\n" for _ in range(3))
                                             + "".join(json.dumps({"text": t}) + "\n" for t in texts[:4]))
    fastenc.embed(str(tmp_path / "in"), minilm, out=tmp_path / "o.parquet", window=3, on_bad="skip")
    t = pq.read_table(tmp_path / "o.parquet")
    assert t.column("id").to_pylist() == [f"a.jsonl:{i}" for i in range(3, 7)]
    assert json.loads((tmp_path / "o.parquet" / "_manifest.json").read_text())["params"]["id_type"] == "string"


def test_id_field_with_an_all_skipped_first_window(tmp_path, minilm, texts):
    path = tmp_path / "in.jsonl"
    rows = [{"key": f"k{i}", "text": ""} for i in range(3)]
    rows += [{"key": 10 + i, "text": t} for i, t in enumerate(texts[:4])]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    fastenc.embed(str(path), minilm, out=tmp_path / "o.parquet", window=3, on_bad="skip", id_field="key")
    t = pq.read_table(tmp_path / "o.parquet")
    assert t.column("id").to_pylist() == ["10", "11", "12", "13"]
    assert str(t.schema.field("id").type) == "string"


@pytest.mark.parametrize("name,body", [("in.txt", ""), ("in.jsonl", ""), ("in.csv", "text\n"), ("in.csv", ""),
                                       ("<texts>", None)])
def test_empty_inputs_give_valid_empty_outputs(tmp_path, minilm, name, body):
    inputs = []
    if body is not None:
        (tmp_path / name).write_text(body)
        inputs = str(tmp_path / name)
    s = fastenc.embed(inputs, minilm, out=tmp_path / "o.parquet")
    t = pq.read_table(tmp_path / "o.parquet")
    assert (t.num_rows, t.column_names, s.texts) == (0, ["id", "embedding"], 0)
    assert str(t.schema.field("embedding").type) == "fixed_size_list<element: float>[384]"
    fastenc.embed(inputs, minilm, out=tmp_path / "o.npy")
    a = np.load(tmp_path / "o.npy")
    assert a.shape == (0, 384) and a.dtype == np.float32


def test_byte_order_marks_are_read(tmp_path, minilm, texts):
    body = texts[:3]
    files = {"in.txt": "\n".join(body) + "\n",
             "in.jsonl": "".join(json.dumps({"text": t, "id": f"r{i}"}) + "\n" for i, t in enumerate(body))}
    with open(tmp_path / "plain.csv", "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([["text", "id"]] + [[t, f"r{i}"] for i, t in enumerate(body)])
    files["in.csv"] = (tmp_path / "plain.csv").read_text(encoding="utf-8")
    want = minilm.encode(body, batch_size=3).numpy()
    for name, text in files.items():
        path = tmp_path / name
        path.write_bytes(b"\xef\xbb\xbf" + text.encode())
        r = fastenc.embed(str(path), minilm, id_field=None if name == "in.txt" else "id")
        assert r.ids == ([0, 1, 2] if name == "in.txt" else ["r0", "r1", "r2"]), name
        np.testing.assert_allclose(r.embeddings, want, atol=2e-6, rtol=0)
        src = resolve_sources(str(path))
        whole = list(iter_records(src, "text", None))
        blocks = [r for b in split_source(src[0], 2) for r in iter_block(b, "text", None)]
        assert blocks == whole and whole[0].text == body[0], name  # the Ray engine's blocks read the same


def test_row_0_without_the_text_field_is_skipped(tmp_path, minilm, texts):
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"title": "no text here"}) + "\n" + json.dumps({"text": texts[0]}) + "\n")
    r = fastenc.embed(str(path), minilm, on_bad="skip")
    assert r.ids == [1] and r.summary.skipped == 1 and "no field 'text'" in r.summary.bad[0][2]
    with pytest.raises(ValueError, match=r"bad row 0 of .*in.jsonl: no field 'text'"):
        fastenc.embed(str(path), minilm)
    path.write_text(json.dumps({"title": "a"}) + "\n" + json.dumps({"title": "b"}) + "\n")
    with pytest.raises(ValueError, match=r"text_field 'text' is not a field of any row of '.*in.jsonl' \(fields of "
                                         r"its first object row: \['title'\]\)"):
        check_fields(resolve_sources(str(path)), "text", None)


@pytest.mark.parametrize("out", ["in/o.parquet", "in/sub/o.npy"])
def test_output_inside_an_input_folder_is_refused(tmp_path, minilm, out):
    (tmp_path / "in" / "sub").mkdir(parents=True)
    (tmp_path / "in" / "a.txt").write_text("one\ntwo\n")
    out = tmp_path / out
    folder = re.escape(repr(str(tmp_path / "in")))
    with pytest.raises(ValueError, match=f"out {re.escape(repr(str(out)))} is inside the input folder {folder}"):
        fastenc.embed(str(tmp_path / "in"), minilm, out=out, overwrite=True)
    assert not out.exists() and not writers.work_dir(out).exists()


def test_output_that_would_replace_an_input_is_refused(tmp_path, minilm):
    (tmp_path / "o.parquet").mkdir()  # an old output folder now read as input
    (tmp_path / "o.parquet" / "x.txt").write_text("x\n")
    with pytest.raises(ValueError, match=r"out '.*o.parquet' would replace the input '.*x.txt'"):
        fastenc.embed(str(tmp_path / "o.parquet" / "x.txt"), minilm, out=tmp_path / "o.parquet", overwrite=True)
    assert (tmp_path / "o.parquet" / "x.txt").read_text() == "x\n"


@pytest.fixture
def file_size_limit():
    """limit(n): files this process writes end at n bytes, a write past it failing with EFBIG ('File too large')."""
    old_sig = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    yield lambda n: resource.setrlimit(resource.RLIMIT_FSIZE, (n, old[1]))
    resource.setrlimit(resource.RLIMIT_FSIZE, old)
    signal.signal(signal.SIGXFSZ, old_sig)


@pytest.mark.parametrize("fmt", [".npy", ".parquet"])
def test_write_errors_name_folder_operation_and_reason(tmp_path, minilm, texts, file_size_limit, fmt):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(texts[:12]) + "\n")
    whole, out = tmp_path / f"whole{fmt}", tmp_path / f"o{fmt}"
    fastenc.embed(str(src), minilm, out=whole, window=4)
    wd = writers.work_dir(out)
    file_size_limit(4000)  # a shard is ~6 KB
    with pytest.raises(writers.WriteError) as e:
        fastenc.embed(str(src), minilm, out=out, window=4)
    file_size_limit(resource.RLIM_INFINITY)
    assert str(e.value) == f"embed: cannot write shard part-00000{fmt} in {str(wd)!r}: File too large"
    assert sorted(p.name for p in wd.iterdir()) == ["_manifest.json"] and not out.exists()
    if fmt == ".npy":  # the shards fit, the assembled array does not
        file_size_limit(12000)
        with pytest.raises(writers.WriteError, match=f"cannot assemble 'o.npy' from the shards in "
                                                     f"{re.escape(repr(str(tmp_path)))}: File too large"):
            fastenc.embed(str(src), minilm, out=out, window=4, resume=True)
        file_size_limit(resource.RLIM_INFINITY)
        assert not out.exists() and not out.with_name("o.npy.tmp").exists()
    s = fastenc.embed(str(src), minilm, out=out, window=4, resume=True)
    assert s.texts == 12
    if fmt == ".npy":
        assert out.read_bytes() == whole.read_bytes()
    else:
        assert pq.read_table(out).equals(pq.read_table(whole))


def test_finish_refuses_an_output_that_does_not_open(tmp_path):
    out = tmp_path / "o.parquet"
    wd = writers.work_dir(out)
    wd.mkdir()
    ok = writers.write_shard(wd, ".parquet", 0, [0, 1], np.ones((2, 3), np.float32), np.ones(2, bool), "int64")
    bad = writers.write_shard(wd, ".parquet", 1, ["x"], np.ones((1, 3), np.float32), np.ones(1, bool), "string")
    shards = [{**ok, "texts": 2, "rows_read": 2}, {**bad, "texts": 1, "rows_read": 1}]
    m = {"params": {"id_type": "int64"}, "shards": shards}
    with pytest.raises(ValueError, match=r"does not open as one table: part-00001.parquet has the schema"):
        writers.finish(out, wd, ".parquet", m, 3)
    assert not out.exists() and wd.is_dir()


def test_standard_input_bom_and_csv_header(minilm, monkeypatch):
    import io
    import sys

    def stdin(data: bytes):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))

    stdin(b"\xef\xbb\xbftext\nhello there\n")
    r = fastenc.embed("-", minilm, stdin_format="csv")
    np.testing.assert_allclose(r.embeddings, minilm.encode(["hello there"]).numpy(), atol=2e-6, rtol=0)
    stdin(b"title\nhello there\n")
    with pytest.raises(ValueError, match=r"text_field 'text' is not a field of the CSV on standard input "
                                         r"\(fields: \['title'\]\)"):
        fastenc.embed("-", minilm, stdin_format="csv", on_bad="skip")
