"""A real-text corpus made offline: the docstrings of the installed Python standard library and site-packages
(tens of thousands of real English passages of very mixed length), read with `ast` (nothing is imported)."""
from __future__ import annotations

import ast
import inspect
import json
import random
import sys
import sysconfig
import warnings
from pathlib import Path
from typing import Iterator


def _roots() -> list[Path]:
    paths = sysconfig.get_paths()
    roots = []
    for key in ("stdlib", "purelib", "platlib"):
        p = Path(paths[key])
        if p.is_dir() and p not in roots:
            roots.append(p)
    return roots


def _docstrings(path: Path) -> Iterator[str]:
    try:
        src = path.read_text(encoding="utf-8")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(src)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError, RecursionError):
        return
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield inspect.cleandoc(doc)


def docstring_passages(limit: int | None = 20000, min_chars: int = 20, max_chars: int = 4000) -> Iterator[str]:
    """Unique docstrings (whitespace-normalized lines kept), in a fixed order: files sorted by path under the
    standard library, then site-packages. Stops after `limit` passages (None: all)."""
    seen: set[int] = set()
    n = 0
    for root in _roots():
        for path in sorted(root.rglob("*.py")):
            if "site-packages" in path.parts and root.name != "site-packages" and "site-packages" not in root.parts:
                continue  # the stdlib walk does not descend into a venv's site-packages
            for doc in _docstrings(path):
                text = " ".join(doc.split())
                if not (min_chars <= len(text) <= max_chars):
                    continue
                h = hash(text)
                if h in seen:
                    continue
                seen.add(h)
                yield text
                n += 1
                if limit is not None and n >= limit:
                    return


def shuffled(texts, seed: int = 0) -> list[str]:
    """`texts` (e.g. docstring_passages(40000)) in a fixed pseudo-random order (`seed`). The file order is not one
    distribution: the later files (site-packages) hold longer passages than the standard library's first ones, so
    the first 10,000 and the first 40,000 passages differ in content, not only in number. Every prefix of the
    shuffled list samples the same mix: its first quarter and the whole differ in number only."""
    out = list(texts)
    random.Random(seed).shuffle(out)
    return out


def write_texts(path: str | Path, texts) -> int:
    """Write `texts` to `path` (.txt one per line, or .jsonl with {"id": "doc-<i>", "text"}); returns the count."""
    path = Path(path)
    n = 0
    with open(path, "w", encoding="utf-8") as fh:
        for i, text in enumerate(texts):
            fh.write(json.dumps({"id": f"doc-{i}", "text": text}) + "\n" if path.suffix == ".jsonl" else text + "\n")
            n += 1
    return n


def write_corpus(path: str | Path, limit: int | None = 20000) -> int:
    """Write the first `limit` passages (file order) to `path` (see write_texts); returns the count."""
    return write_texts(path, docstring_passages(limit))


if __name__ == "__main__":
    print(write_corpus(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 20000))
