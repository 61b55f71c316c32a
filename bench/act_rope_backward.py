"""Forward + backward of gelu, geglu, rope on this machine: the same cases as
`fastenc bench kernels --backward --ops gelu,geglu,rope` (fastenc/benchmark/backward.py: fastenc beside torch eager autograd
of the same math and torch.compile of it, interleaved in one process, paired ratios with their spread, the bytes or
FLOPs of each and the fraction of the measured ceilings).
Usage: python bench/act_rope_backward.py [--quick] [--no-compile] [--threads N] [--out DIR]
Writes DIR/backward.json (default bench/out/act_rope_backward/).
"""
from __future__ import annotations

import sys
from pathlib import Path

from fastenc import cli


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--out" not in argv:
        argv += ["--out", str(Path(__file__).resolve().parent / "out" / "act_rope_backward")]
    return cli.main(["bench", "kernels", "--backward", "--ops", "gelu,geglu,rope", *argv])


if __name__ == "__main__":
    raise SystemExit(main())
