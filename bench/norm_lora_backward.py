"""Forward + backward of layer_norm, rms_norm, lora_linear on this machine: the same cases as
`fastenc bench kernels --backward --ops layer_norm,rms_norm,lora_linear` (fastenc/benchmark/backward.py: fastenc beside torch eager autograd
of the same math and torch.compile of it, interleaved in one process, paired ratios with their spread, the bytes or
FLOPs of each and the fraction of the measured ceilings).
Usage: python bench/norm_lora_backward.py [--quick] [--no-compile] [--threads N] [--out DIR]
Writes DIR/backward.json (default bench/out/norm_lora_backward/).
"""
from __future__ import annotations

import sys
from pathlib import Path

from fastenc import cli


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--out" not in argv:
        argv += ["--out", str(Path(__file__).resolve().parent / "out" / "norm_lora_backward")]
    return cli.main(["bench", "kernels", "--backward", "--ops", "layer_norm,rms_norm,lora_linear", *argv])


if __name__ == "__main__":
    raise SystemExit(main())
