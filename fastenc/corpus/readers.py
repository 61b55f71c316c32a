"""Streaming readers for the corpus job: .txt (one text a line), .jsonl, .csv, .parquet, a folder of them, standard
input, or an in-memory iterable of strings, each yielding Record(id, text) in input order one row at a time, so a
corpus larger than memory streams through. Row ids (the --id-field value, else the row number in its file, prefixed
by the file's relative path in a folder: "part-1.txt:17") and the bad-row policy (skip and count, or raise naming
the file and row) are the same for both engines; the Ray engine's blocks (runs of consecutive rows of one file)
yield exactly the records the whole-file reader gives for their rows, so outputs compare row by row.
Text is UTF-8; a byte order mark at the start of a file (or of standard input) is dropped.
"""
from __future__ import annotations

import csv
import io
import itertools
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

FORMATS = (".txt", ".jsonl", ".csv", ".parquet")


class BadRowError(ValueError):
    """A bad input row under on_bad='error'."""


class MissingFieldError(ValueError):
    """Standard input's CSV header lacks the text (or id) field."""


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


def id_type(sources: list[Source] | None, id_field: str | None) -> str:
    """The id column's type of the whole output, known before the first row: 'string' for --id-field values and
    folder (or several inputs') ids, 'int64' for row numbers of one file, standard input or in-memory texts."""
    if sources is not None and (id_field is not None or any(s.prefix for s in sources)):
        return "string"
    return "int64"


def _jsonl_field_scan(path: Path, fields: list[str]) -> tuple[set[str], list | None, bool]:
    """(fields of `fields` found in some row, the first object row's field names, any data row at all), reading
    rows until every field of `fields` is found (usually in the first row)."""
    found: set[str] = set()
    first = None
    rows = False
    with open(path, encoding="utf-8-sig", errors="surrogateescape", newline="") as fh:
        for line in fh:
            rows = True
            try:
                obj = json.loads(line)
            except ValueError:
                continue  # a bad row is the row policy's business
            if not isinstance(obj, dict):
                continue
            if first is None:
                first = list(obj)
            found.update(f for f in fields if f in obj)
            if len(found) == len(fields):
                break
    return found, first, rows


def check_fields(sources: list[Source], text_field: str, id_field: str | None) -> None:
    """Before any work: the text (and id) field is in every CSV header and parquet schema, and in at least one row
    of every .jsonl file that has rows (a row without it is a bad row, under the row policy)."""
    wanted = [(text_field, "text_field")] + ([(id_field, "id_field")] if id_field is not None else [])
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
            with open(src.path, newline="", encoding="utf-8-sig", errors="surrogateescape") as fh:
                names = next(csv.reader(fh), None)
            if names is None:
                continue  # an empty file: no rows, nothing to check
        else:
            found, first, rows = _jsonl_field_scan(src.path, [f for f, _ in wanted])
            for field, what in wanted:
                if rows and field not in found:
                    raise ValueError(f"embed: {what} {field!r} is not a field of any row of {name!r} (fields of "
                                     f"its first object row: {first})")
            continue
        for field, what in wanted:
            if field not in names:
                raise ValueError(f"embed: {what} {field!r} is not a field of {name!r} (fields: {names})")


def _undecodable(s: str) -> bool:
    try:
        s.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True


def _text_stream(src: Source):
    """The source as text; a UTF-8 byte order mark at its start is dropped."""
    if src.path is None:
        return io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8-sig", errors="surrogateescape", newline="")
    return open(src.path, encoding="utf-8-sig", errors="surrogateescape", newline="")


def _line_rows(lines: Iterable[str], fmt: str, text_field: str, id_field: str | None):
    """(id or None, text value, why-bad) per line of a .txt or .jsonl source."""
    if fmt == ".txt":
        for line in lines:
            yield None, line.rstrip("\r\n"), ""
        return
    for line in lines:
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


def _csv_rows(reader: Iterable[dict], text_field: str, id_field: str | None):
    for row in reader:
        if row.get(text_field) is None:
            yield None, None, f"no field {text_field!r}"
        else:
            yield row.get(id_field) if id_field else None, row[text_field], ""


def _parquet_columns(text_field: str, id_field: str | None) -> list[str]:
    return [text_field] + ([id_field] if id_field and id_field != text_field else [])


def _parquet_rows(batches, text_field: str, id_field: str | None):
    for batch in batches:
        texts = batch.column(text_field).to_pylist()
        ids = batch.column(id_field).to_pylist() if id_field else [None] * len(texts)
        yield from ((i, t, "") for i, t in zip(ids, texts))


def _rows(src: Source, text_field: str, id_field: str | None) -> Iterator[tuple[Any, Any, str]]:
    """(id or None, text value, why-bad) per data row."""
    if src.fmt in (".txt", ".jsonl"):
        with _text_stream(src) as fh:
            yield from _line_rows(fh, src.fmt, text_field, id_field)
    elif src.fmt == ".csv":
        with _text_stream(src) as fh:
            reader = csv.DictReader(fh)
            if src.path is None and reader.fieldnames is not None:  # files are checked before any work
                for field, what in ((text_field, "text_field"), (id_field, "id_field")):
                    if field is not None and field not in reader.fieldnames:
                        raise MissingFieldError(f"embed: {what} {field!r} is not a field of the CSV on standard "
                                                f"input (fields: {reader.fieldnames})")
            yield from _csv_rows(reader, text_field, id_field)
    else:
        batches = parquet().ParquetFile(src.path).iter_batches(columns=_parquet_columns(text_field, id_field),
                                                               batch_size=4096)
        yield from _parquet_rows(batches, text_field, id_field)


def _checked(src: Source, rows: Iterable[tuple[Any, Any, str]], first_row: int, text_field: str,
             id_field: str | None, on_bad: str) -> Iterator[Record]:
    """Records of `rows` (the data rows of `src` from row `first_row` on): the bad-row policy and the row ids."""
    name = "<stdin>" if src.path is None else str(src.path)
    for row, (rid, text, why) in enumerate(rows, first_row):
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
            raise bad_row_error(name, row, why)
        ident = str(rid) if id_field is not None and rid is not None else (f"{src.prefix}{row}" if src.prefix else row)
        yield Record(ident, None if why else text, name, row, why)


def bad_row_error(source: str, row: int, why: str) -> BadRowError:
    """The error on_bad='error' raises for row `row` of file `source`."""
    return BadRowError(f"embed: bad row {row} of {source}: {why} (use on_bad='skip' / --on-bad skip to skip such rows)")


def _check_on_bad(on_bad: str) -> None:
    if on_bad not in ("skip", "error"):
        raise ValueError(f"embed: on_bad must be 'skip' or 'error', got {on_bad!r}")


def iter_records(sources: list[Source], text_field: str = "text", id_field: str | None = None,
                 on_bad: str = "error") -> Iterator[Record]:
    """Every row of every source in order; bad rows come out with text=None and the reason (on_bad='skip') or
    raise BadRowError naming the file and row (on_bad='error')."""
    _check_on_bad(on_bad)
    for src in sources:
        yield from _checked(src, _rows(src, text_field, id_field), 0, text_field, id_field, on_bad)


def iter_texts(texts: Iterable[str], on_bad: str = "error") -> Iterator[Record]:
    """Records of an in-memory iterable of strings (ids = positions)."""
    _check_on_bad(on_bad)
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


# ---------------------------------------------------------------- blocks of one file
# One pass over the file finds where every rows_per_block-th data row starts: a byte offset for txt, jsonl and csv
# (lines split as a text file opened with newline="" splits them; a csv record may span lines, so csv is parsed
# for it), a row number for parquet (whose block reads only the row groups it overlaps).

@dataclass(frozen=True)
class Block:
    source: Source
    offset: int      # byte offset of the block's first data row (txt, jsonl, csv; 0 for parquet)
    first_row: int   # 0-based number of that row within the file (as Record.row)
    rows: int        # data rows in the block


_LINE = re.compile(rb"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")


def _raw_lines(fh) -> Iterator[bytes]:
    """Lines of a binary file where a text file opened with newline="" ends them: after \\n, \\r\\n or a lone \\r
    (terminators kept, so their lengths add up to byte offsets)."""
    for line in fh:  # ends after b"\n" only
        cr = line.count(b"\r")
        if cr == 0 or (cr == 1 and line.endswith(b"\r\n")):
            yield line
        else:
            yield from _LINE.findall(line)


BOM = b"\xef\xbb\xbf"


def _decoded(lines: Iterable[bytes], at_start: bool = False) -> Iterator[str]:
    """Lines decoded as the text readers decode them (at_start: the first line is the file's, whose byte order
    mark is dropped)."""
    # \r and \n never occur inside a UTF-8 sequence, so decoding line by line equals decoding the stream
    for line in lines:
        if at_start:
            line = line[len(BOM):] if line.startswith(BOM) else line
            at_start = False
        yield line.decode("utf-8", "surrogateescape")


def split_source(src: Source, rows_per_block: int) -> list[Block]:
    """Blocks of `rows_per_block` consecutive data rows (the last of a file, or of a parquet row group, may be
    shorter) covering the file of `src`, in order; none for a file without data rows."""
    if src.path is None:
        raise ValueError("embed: standard input cannot be split into blocks")
    if not isinstance(rows_per_block, int) or isinstance(rows_per_block, bool) or rows_per_block < 1:
        raise ValueError(f"embed: rows_per_block must be a positive int, got {rows_per_block!r}")
    if src.fmt == ".parquet":
        meta = parquet().ParquetFile(src.path).metadata
        blocks, start = [], 0
        for g in range(meta.num_row_groups):
            n = meta.row_group(g).num_rows
            blocks += [Block(src, 0, start + k, min(rows_per_block, n - k)) for k in range(0, n, rows_per_block)]
            start += n
        return blocks
    starts: list[tuple[int, int]] = []  # (offset, row) of each block's first row
    with open(src.path, "rb") as fh:
        if src.fmt == ".csv":
            consumed = [0]

            def lines():
                for line in _raw_lines(fh):
                    consumed[0] += len(line)
                    yield line.decode("utf-8", "surrogateescape")

            before, total = 0, 0  # the parser stops at a record's last line: `before` is where the next one starts
            for total, _ in enumerate(csv.DictReader(lines()), 1):
                if (total - 1) % rows_per_block == 0:
                    starts.append((before, total - 1))
                before = consumed[0]
        else:
            offset, total = 0, 0
            for total, line in enumerate(_raw_lines(fh), 1):
                if (total - 1) % rows_per_block == 0:
                    starts.append((offset, total - 1))
                offset += len(line)
    ends = [row for _, row in starts[1:]] + [total]
    return [Block(src, off, row, end - row) for (off, row), end in zip(starts, ends)]


def _parquet_slice(path: Path, first: int, n: int, columns: list[str]):
    """Record batches of rows [first, first + n) of a parquet file, reading only the row groups they lie in."""
    f = parquet().ParquetFile(path)
    groups, start, skip = [], 0, 0
    for g in range(f.metadata.num_row_groups):
        k = f.metadata.row_group(g).num_rows
        if start < first + n and start + k > first:
            if not groups:
                skip = first - start
            groups.append(g)
        start += k
    if not groups:
        return
    for batch in f.iter_batches(row_groups=groups, columns=columns, batch_size=4096):
        if skip >= batch.num_rows:
            skip -= batch.num_rows
            continue
        batch = batch.slice(skip, n)
        skip, n = 0, n - batch.num_rows
        yield batch
        if n <= 0:
            return


def _block_rows(block: Block, text_field: str, id_field: str | None) -> Iterator[tuple[Any, Any, str]]:
    src = block.source
    if src.fmt == ".parquet":
        batches = _parquet_slice(src.path, block.first_row, block.rows, _parquet_columns(text_field, id_field))
        yield from _parquet_rows(batches, text_field, id_field)
        return
    with open(src.path, "rb") as fh:
        if src.fmt == ".csv":
            # a later block is read with the header's field names, as csv.DictReader reads it (its first record)
            header = next(csv.reader(_decoded(_raw_lines(fh), True)), None) if block.first_row else None
            fh.seek(block.offset)
            reader = csv.DictReader(_decoded(_raw_lines(fh), block.offset == 0), fieldnames=header)
            yield from itertools.islice(_csv_rows(reader, text_field, id_field), block.rows)
        else:
            fh.seek(block.offset)
            lines = _decoded(_raw_lines(fh), block.offset == 0)
            yield from itertools.islice(_line_rows(lines, src.fmt, text_field, id_field), block.rows)


def iter_block(block: Block, text_field: str = "text", id_field: str | None = None,
               on_bad: str = "error") -> Iterator[Record]:
    """The records of one block: those iter_records gives for rows first_row .. first_row + rows - 1 of its file."""
    _check_on_bad(on_bad)
    yield from _checked(block.source, _block_rows(block, text_field, id_field), block.first_row, text_field,
                        id_field, on_bad)
