"""No dead code in the package: every function and class defined in fastenc/ (its Triton kernels included) is used somewhere in
the repository (code, tests, benchmarks), and no check guards an attribute that always exists."""
from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("fastenc",)
# Names called by a framework rather than by our code.
CALLED_BY_FRAMEWORK = {"forward", "extra_repr", "setup_context", "backward", "add_parser", "main"}


def _python_files() -> dict[Path, str]:
    dirs = (*PACKAGES, "tests", "bench")
    files = [p for d in dirs for p in (ROOT / d).rglob("*.py")] + [ROOT / "setup.py"]
    return {p: p.read_text() for p in files if p.is_file()}


def _unused(texts: dict[Path, str]) -> list[str]:
    # A name's uses are the maximal word-character runs equal to it (what the regex \bname\b finds), counted once
    # over every text.
    words = Counter(w for t in texts.values() for w in re.findall(r"\w+", t))
    unused = []
    for path, text in texts.items():
        if path.relative_to(ROOT).parts[0] not in PACKAGES:
            continue
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            name = node.name
            if name.startswith("__") or name == "_" or name in CALLED_BY_FRAMEWORK:
                continue
            uses = words[name]
            if uses <= 1:  # only its own definition
                unused.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    return unused


def test_every_function_is_used():
    unused = _unused(_python_files())
    assert not unused, "defined but never used: " + ", ".join(unused)


def test_finder_sees_an_unused_function(tmp_path, monkeypatch):
    fake = ROOT / "fastenc" / "_never_written.py"
    texts = {fake: "def used():\n    pass\n\ndef dead_function_xyz():\n    return used()\n"}
    assert _unused(texts) == ["fastenc/_never_written.py:4 dead_function_xyz"]


def test_no_always_true_hasattr_on_reference():
    import fastenc.reference as reference

    hits = []
    for path, text in _python_files().items():
        for m in re.finditer(r"hasattr\(reference, \"(\w+)\"\)", text):
            hits.append(f"{path.relative_to(ROOT)}: hasattr(reference, {m.group(1)!r})"
                        + (" (always true)" if hasattr(reference, m.group(1)) else ""))
    assert not hits, "; ".join(hits)
