"""Streaming readers for the corpus job: .txt (one text a line), .jsonl, .csv, .parquet, a folder of them, standard
input, or an in-memory iterable of strings. Each yields Record(id, text) in input order, one row at a time, so a
corpus larger than memory streams through.

Row ids: the --id-field value when one is named; otherwise the 0-based row number within its file, prefixed by the
file's path relative to the folder ("part-1.txt:17") when the input is a folder. Both engines (in process and Ray)
use this scheme, so their outputs can be compared row by row.

Bad rows (empty text, a text field that is not a string or is missing, undecodable bytes, an unparsable line) are
skipped and counted, or raise an error naming the file and row, by the `on_bad` policy.
"""
from __future__ import annotations

import csv
import io
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

FORMATS = (".txt", ".jsonl", ".csv", ".parquet")


class BadRowError(ValueError):
    """A bad input row under on_bad='error'."""


@dataclass(frozen=True)
class Record:
    id: Any          # str or int (see module docstring)
    text: str | None  # None: a bad row (reason in `bad`)
    source: str      # file name or "<stdin>" / "<texts>"
    row: int         # 0-based row within the source (data rows: a CSV header is not counted)
    bad: str = ""


@dataclass(frozen=True)
class Source:
    path: Path | None   # None: standard input
    fmt: str            # one of FORMATS
    prefix: str         # id prefix ("" for a single file)


def parquet():
    """pyarrow.parquet, or a clear error naming the extra that brings it."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError("embed: parquet input/output needs pyarrow: pip install pyarrow (or the "
                          "fastenc[parquet] extra)") from None
    return pq


def _fmt_of(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise ValueError(f"embed: input {str(path)!r} has an unknown extension {suffix or '(none)'!r}; expected one "
                         f"of {', '.join(FORMATS)}")
    return suffix


def resolve_sources(inputs: str | Path | list, stdin_format: str = ".txt") -> list[Source]:
    """Files of the job, in order: a file, a folder (its supported files, sorted, recursively), '-' for standard
    input, or a list of those. Raises before any work for a missing or unreadable input or an unknown extension."""
    items = inputs if isinstance(inputs, (list, tuple)) else [inputs]
    if not items:
        raise ValueError("embed: no input given")
    many = len(items) > 1
    out: list[Source] = []
    for item in items:
        if str(item) == "-":
            fmt = stdin_format if stdin_format.startswith(".") else "." + stdin_format
            if fmt not in (".txt", ".jsonl", ".csv"):
                raise ValueError(f"embed: standard input must be txt, jsonl or csv, got {stdin_format!r}")
            out.append(Source(None, fmt, "<stdin>:" if many else ""))
            continue
        path = Path(item)
        if not path.exists():
            raise FileNotFoundError(f"embed: input {str(path)!r} does not exist")
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in FORMATS
                           and not any(part.startswith(".") for part in p.relative_to(path).parts))
            if not files:
                raise ValueError(f"embed: folder {str(path)!r} holds no {', '.join(FORMATS)} file")
            for f in files:
                out.append(Source(f, _fmt_of(f), f"{f.relative_to(path).as_posix()}:"))
        else:
            fmt = _fmt_of(path)
            try:
                with open(path, "rb") as fh:
                    fh.read(1)
            except OSError as e:
                raise PermissionError(f"embed: input {str(path)!r} cannot be read: {e.strerror or e}") from None
            out.append(Source(path, fmt, f"{path.name}:" if many else ""))
    return out


def check_fields(sources: list[Source], text_field: str, id_field: str | None) -> None:
    """Before any work: the text (and id) field exists in every CSV header, parquet schema and first JSON line."""
    for src in sources:
        if src.path is None or src.fmt == ".txt":
            continue
        name = str(src.path)
        if src.fmt == ".parquet":
            pq = parquet()
            try:
                names = pq.ParquetFile(src.path).schema_arrow.names
            except Exception as e:  # noqa: BLE001 (pyarrow raises several types for a corrupt file)
                raise ValueError(f"embed: {name!r} is not a readable parquet file: {e}") from None
        elif src.fmt == ".csv":
            with open(src.path, newline="", encoding="utf-8", errors="surrogateescape") as fh:
                names = next(csv.reader(fh), [])
        else:
            names = None
            with open(src.path, encoding="utf-8", errors="surrogateescape") as fh:
                for line in fh:
                    if line.strip():
                        try:
                            obj = json.loads(line)
                        except ValueError:
                            break  # a bad first row is the row policy's business
                        names = list(obj) if isinstance(obj, dict) else None
                        break
            if names is None:
                continue
        for field, what in ((text_field, "text_field"), (id_field, "id_field")):
            if field is not None and field not in names:
                raise ValueError(f"embed: {what} {field!r} is not a field of {name!r} (fields: {names})")


def _undecodable(s: str) -> bool:
    try:
        s.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True


def _text_stream(src: Source):
    if src.path is None:
        return io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="surrogateescape", newline="")
    return open(src.path, encoding="utf-8", errors="surrogateescape", newline="")


def _rows(src: Source, text_field: str, id_field: str | None) -> Iterator[tuple[Any, Any, str]]:
    """(id or None, text value, why-bad) per data row."""
    if src.fmt == ".txt":
        with _text_stream(src) as fh:
            for line in fh:
                yield None, line.rstrip("\r\n"), ""
    elif src.fmt == ".jsonl":
        with _text_stream(src) as fh:
            for line in fh:
                try:
                    obj = json.loads(line)
                except ValueError:
                    yield None, None, "not a JSON object"
                    continue
                if not isinstance(obj, dict):
                    yield None, None, "not a JSON object"
                elif text_field not in obj:
                    yield None, None, f"no field {text_field!r}"
                else:
                    yield obj.get(id_field) if id_field else None, obj[text_field], ""
    elif src.fmt == ".csv":
        with _text_stream(src) as fh:
            for row in csv.DictReader(fh):
                if row.get(text_field) is None:
                    yield None, None, f"no field {text_field!r}"
                else:
                    yield row.get(id_field) if id_field else None, row[text_field], ""
    else:
        pq = parquet()
        cols = [text_field] + ([id_field] if id_field and id_field != text_field else [])
        for batch in pq.ParquetFile(src.path).iter_batches(columns=cols, batch_size=4096):
            texts = batch.column(text_field).to_pylist()
            ids = batch.column(id_field).to_pylist() if id_field else [None] * len(texts)
            for i, t in zip(ids, texts):
                yield i, t, ""


def iter_records(sources: list[Source], text_field: str = "text", id_field: str | None = None,
                 on_bad: str = "error") -> Iterator[Record]:
    """Every row of every source in order; bad rows come out with text=None and the reason (on_bad='skip') or
    raise BadRowError naming the file and row (on_bad='error')."""
    if on_bad not in ("skip", "error"):
        raise ValueError(f"embed: on_bad must be 'skip' or 'error', got {on_bad!r}")
    for src in sources:
        name = "<stdin>" if src.path is None else str(src.path)
        for row, (rid, text, why) in enumerate(_rows(src, text_field, id_field)):
            if not why:
                if not isinstance(text, str):
                    why = f"field {text_field!r} is {type(text).__name__}, not a string"
                elif _undecodable(text):
                    why = "undecodable bytes (not UTF-8)"
                elif not text.strip():
                    why = "empty text"
                elif id_field is not None and rid is None:
                    why = f"no id in field {id_field!r}"
            if why and on_bad == "error":
                raise BadRowError(f"embed: bad row {row} of {name}: {why} (use on_bad='skip' / --on-bad skip to "
                                  "skip such rows)")
            ident = str(rid) if id_field is not None and rid is not None else (f"{src.prefix}{row}" if src.prefix else row)
            yield Record(ident, None if why else text, name, row, why)


def iter_texts(texts: Iterable[str], on_bad: str = "error") -> Iterator[Record]:
    """Records of an in-memory iterable of strings (ids = positions)."""
    if on_bad not in ("skip", "error"):
        raise ValueError(f"embed: on_bad must be 'skip' or 'error', got {on_bad!r}")
    for row, text in enumerate(texts):
        why = ""
        if not isinstance(text, str):
            why = f"item is {type(text).__name__}, not a string"
        elif _undecodable(text):
            why = "undecodable characters"
        elif not text.strip():
            why = "empty text"
        if why and on_bad == "error":
            raise BadRowError(f"embed: bad text at position {row}: {why} (use on_bad='skip' to skip such rows)")
        yield Record(row, None if why else text, "<texts>", row, why)
