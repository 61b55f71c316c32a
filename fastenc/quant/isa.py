"""Which instruction set the int8 GEMM (csrc/cpu/int8_linear*.cpp) runs on: the fastest this machine has (AMX, else
AVX-512 VNNI, else AVX2), or the one FASTENC_INT8_ISA names (a machine lacking it refuses with the reason)."""
from __future__ import annotations

import os

ISAS = ("avx2", "avx512_vnni", "amx")  # slowest first
ENV = "FASTENC_INT8_ISA"


_PARSED: dict[str | None, str] = {}  # FASTENC_INT8_ISA's raw value -> its meaning (read on every int8 call)


def isa() -> str:
    """FASTENC_INT8_ISA ("avx2", "avx512_vnni" or "amx"), or "" for the fastest this machine runs (unset, "" or
    "auto")."""
    raw = os.environ.get(ENV)
    got = _PARSED.get(raw)
    if got is not None:
        return got
    name = (raw or "").strip().lower()
    if name in ("", "auto"):
        name = ""
    elif name not in ISAS:
        raise ValueError(f"{ENV} must be one of {', '.join(ISAS)} or auto, got {name!r}")
    _PARSED[raw] = name
    return name


def available() -> dict[str, str | None]:
    """Each path -> None where this machine runs it, else why not (builds the extension's cpu half if needed)."""
    from fastenc import extension

    return dict(extension.load().int8_isas())


def chosen() -> str:
    """The path the int8 GEMM takes now: FASTENC_INT8_ISA's, else the fastest available."""
    from fastenc import extension

    return isa() or extension.load().int8_isa_best()
