"""Every `#pragma omp simd` loop of csrc/cpu compiles to vector code under the extension's own flags, on AVX2 and
on AVX-512. GCC reports a loop it would not if-convert as "not vectorized: control flow in loop"; on AVX2 that
happened to the GELU loops without -fno-trapping-math (8x slower than torch's GELU), while AVX-512's masked ops
hid it. Needs g++, not the CPU in question (-march selects the target).
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from fastenc import extension

CSRC = Path(__file__).resolve().parents[2] / "csrc"
TARGETS = ("haswell", "znver3", "skylake-avx512")
CXX = shutil.which("g++")

pytestmark = pytest.mark.skipif(CXX is None, reason="g++ not found")


def simd_loop_lines(src: Path) -> set[int]:
    """1-based line numbers of the loops that follow a `#pragma omp simd`."""
    lines = src.read_text().splitlines()
    return {i + 2 for i, ln in enumerate(lines) if re.match(r"\s*#pragma omp simd\b", ln)}


# The sources with omp simd loops (attention.cpp vectorizes with explicit vector types instead).
SOURCES = sorted(p.name for p in (CSRC / "cpu").glob("*.cpp") if simd_loop_lines(p))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("source", SOURCES)
def test_simd_loops_vectorize(source, target, tmp_path):
    src = CSRC / "cpu" / source
    loops = simd_loop_lines(src)
    flags = [f for f in extension.cflags(aot=True) if not f.startswith("-march=")] + [f"-march={target}"]
    cmd = [CXX, *flags, "-std=c++17", f"-I{CSRC}", "-fopt-info-vec-missed", "-c", str(src), "-o",
           str(tmp_path / "k.o")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr[-2000:]
    scalar = sorted({int(m.group(1)) for m in re.finditer(
        rf"^(?:\S*/)?{re.escape(source)}:(\d+):\d+: missed: not vectorized: control flow in loop", res.stderr, re.M)} & loops)
    assert not scalar, (f"{source} -march={target}: the omp simd loops at lines {scalar} stay scalar "
                        f"(flags {' '.join(flags)})")
