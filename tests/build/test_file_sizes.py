"""No Python or C++ source of the project runs past 500 lines: past that a file holds more than one concern."""
from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 500
SUFFIXES = (".py", ".cpp", ".cu", ".h", ".cuh")


def test_no_source_over_the_limit():
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split("\n")
    sizes = {rel: len((ROOT / rel).read_text().splitlines()) for rel in files
             if rel.endswith(SUFFIXES) and (ROOT / rel).is_file()}
    assert len(sizes) > 100, len(sizes)  # the sources were found
    over = {rel: n for rel, n in sizes.items() if n > LIMIT}
    assert not over, over
