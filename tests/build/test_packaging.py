"""pyproject.toml lists every package under fastenc/: a non-editable install otherwise leaves one out."""
from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_is_listed():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "fastenc").rglob("__init__.py")}
    assert found <= listed, sorted(found - listed)
