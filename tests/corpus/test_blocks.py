"""A file split into blocks of rows (what the Ray engine's tasks read): the blocks' records, in order, are exactly
the whole-file reader's (ids, texts, row numbers, bad-row reasons, errors) for every format and block size."""
import csv
import json

import pytest

from fastenc.corpus.readers import (BadRowError, Block, iter_block, iter_records, resolve_sources,
                                    split_source)

# line ends of every kind (\n, \r\n, a lone \r), an empty line, non-UTF-8 bytes, multi-byte characters, no final end
TXT = (b"first\nsecond\r\nthird\rfourth\n\nfifth \xe2\x82\xac\n\xff bad bytes\n\r\nlast words\r\n"
       + b"".join(b"line %d\n" % i for i in range(9)) + b"no end")


def _jsonl() -> bytes:
    rows = [json.dumps({"text": f"t{i}", "id": f"k{i}"}) for i in range(7)]
    rows[2] = "not json"
    rows[4] = json.dumps({"other": 1})
    rows[5] = json.dumps({"text": 5, "id": "k5"})
    return ("\r\n".join(rows[:3]) + "\n" + "\n".join(rows[3:]) + "\n" + json.dumps(["a list"]) + "\n"
            + json.dumps({"text": "tail", "id": "k9"})).encode()


def _csv(tmp_path) -> bytes:
    path = tmp_path / "w.csv"
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["id", "text"])
        for i in range(11):
            text = {2: "two\nlines", 3: "", 5: "quoted, \"comma\"\r\nand crlf", 8: "   "}.get(i, f"row {i} \u00e9")
            w.writerow([f"c{i}", text])
        fh.write("\r\n")       # a blank row (DictReader skips it)
        fh.write("c11\n")      # a short row: no text field
        fh.write("c12,after a short row")
    return path.read_bytes()


def _records(recs):
    return [(r.id, r.text, r.source, r.row, r.bad) for r in recs]


@pytest.mark.parametrize("fmt", [".txt", ".jsonl", ".csv"])
def test_blocks_equal_the_whole_file(tmp_path, fmt):
    data = {".txt": TXT, ".jsonl": _jsonl()}.get(fmt) or _csv(tmp_path)
    path = tmp_path / f"in{fmt}"
    path.write_bytes(data)
    id_field = None if fmt == ".txt" else "id"
    for prefix_many in (False, True):
        srcs = resolve_sources([path, path] if prefix_many else path)
        whole = _records(iter_records(srcs[:1], "text", id_field, "skip"))
        assert len(whole) > 6 and any(r[4] for r in whole) and any(not r[4] for r in whole)
        for size in (1, 2, 3, 5, len(whole) - 1, len(whole), 1000):
            blocks = split_source(srcs[0], size)
            assert [b.rows for b in blocks[:-1]] == [size] * (len(blocks) - 1) and 0 < blocks[-1].rows <= size
            got = [rec for b in blocks for rec in _records(iter_block(b, "text", id_field, "skip"))]
            assert got == whole, (fmt, size)
    if fmt == ".txt":  # ids are row numbers, the lone \r and \r\n split lines as the text reader does
        assert [r[1] for r in whole[:4]] == ["first", "second", "third", "fourth"] and whole[-1][1] == "no end"


def test_parquet_blocks_cross_row_groups(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    texts = [f"text {i}" if i % 7 else "" for i in range(23)]
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": texts, "id": [f"p{i}" for i in range(23)]}), path, row_group_size=10)
    (src,) = resolve_sources(path)
    whole = _records(iter_records([src], "text", "id", "skip"))
    for size in (1, 3, 4, 10, 50):
        blocks = split_source(src, size)
        assert all(b.rows <= size for b in blocks) and sum(b.rows for b in blocks) == 23
        got = [rec for b in blocks for rec in _records(iter_block(b, "text", "id", "skip"))]
        assert got == whole, size
    # a block spanning two row groups (as a hand-made one may) reads across the boundary
    span = _records(iter_block(Block(src, 0, 8, 5), "text", "id", "skip"))
    assert span == whole[8:13]


def test_block_bad_row_error_names_the_file_row(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("a\nb\nc\nd\n\nf\n")
    (src,) = resolve_sources(path)
    blocks = split_source(src, 2)
    assert [(b.first_row, b.rows) for b in blocks] == [(0, 2), (2, 2), (4, 2)]
    assert [r.id for r in iter_block(blocks[1])] == [2, 3]
    with pytest.raises(BadRowError, match=r"bad row 4 of .*in.txt: empty text"):
        list(iter_block(blocks[2]))
    (tmp_path / "empty.txt").write_bytes(b"")
    assert split_source(resolve_sources(tmp_path / "empty.txt")[0], 4) == []
    with pytest.raises(ValueError, match="rows_per_block must be a positive int, got 0"):
        split_source(src, 0)
    with pytest.raises(ValueError, match="on_bad must be 'skip' or 'error', got 'drop'"):
        list(iter_block(blocks[0], on_bad="drop"))
