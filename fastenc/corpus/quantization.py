"""The `quantize` option of the corpus job, `fastenc run`, the server and `fastenc bench embed`: its check (None or
"int8"), its application to a loaded model (fastenc.quantize, whose reason for a refusal is passed on) and the
record of a model's quantization (for the job's manifest and the server's /info)."""
from __future__ import annotations

from typing import Any

MODES = ("int8",)


def check(value: Any, name: str = "quantize") -> str | None:
    """None or one of MODES; anything else raises ValueError naming `name`, the modes and the value."""
    if value is None or (isinstance(value, str) and value in MODES):
        return value
    raise ValueError(f"{name} must be one of {', '.join(MODES)} (or left out for fp32), got {value!r}")


def check_placement(mode: str | None, device=None, dtype=None, name: str = "quantize",
                    labels: tuple[str, str] = ("device=", "dtype=")) -> None:
    """Refuse (ValueError naming `name`) int8 with a device other than the CPU or a dtype other than float32,
    before any model loads: the int8 GEMM is CPU fp32 inference (fastenc.quantize refuses it too, once loaded).
    labels: how the message names the device and dtype arguments."""
    if mode is None:
        return
    dev = str(device) if device is not None else "cpu"
    if not dev.startswith("cpu"):
        raise ValueError(f"{name} {mode} runs on the CPU, got {labels[0]}{dev}")
    kind = str(dtype).replace("torch.", "") if dtype is not None else "float32"
    if kind not in ("float32", "fp32", "auto"):
        raise ValueError(f"{name} {mode} runs in float32, got {labels[1]}{kind}")


def check_option(value: Any, device=None, dtype=None, flag: str = "--quantize") -> str | None:
    """check() and check_placement() for a command line, before any model loads: fastenc.cli_checks.UsageError
    naming `flag`."""
    from fastenc.cli_checks import UsageError

    try:
        mode = check(value, flag)
        check_placement(mode, device, dtype, flag, ("--device ", "--dtype "))
    except ValueError as e:
        raise UsageError(str(e)) from None
    return mode


def apply(model, mode: str | None, name: str = "quantize"):
    """Quantize `model` in place (fastenc.quantize(model, mode)) and return True; False when mode is None or the
    model is quantized already. A model that cannot be quantized raises ValueError naming `name` and
    fastenc.quantize's reason."""
    import fastenc
    from fastenc.quant import is_quantized

    if check(mode, name) is None or is_quantized(model):
        return False
    try:
        fastenc.quantize(model, mode)
    except (ValueError, TypeError, RuntimeError) as e:
        raise ValueError(f"{name}={mode!r}: the model cannot be quantized: {e}") from None
    return True


def int8_path() -> str:
    """The path the int8 GEMM takes in this process: fastenc.quant.isa.chosen() ('avx2', 'avx512_vnni', 'amx'),
    or 'reference' where the cpu backend is not in use (FASTENC_BACKEND / use_backend, or no C++ extension)."""
    from fastenc import extension, registry

    if not registry.backend_allowed("cpu") or extension.cpu_available() is not None:
        return "reference"
    from fastenc.quant import isa

    return isa.chosen()


def describe(model) -> dict[str, Any] | None:
    """None for an fp32 model; for a quantized one {mode, int8_path, layers (how many Linears run int8), kept_fp32
    (the encoder Linears left in fp32), asym (activations with a zero point; a list when the layers differ)}."""
    from fastenc.quant import encoder_linears, is_quantized, quantized_layers

    if not is_quantized(model):
        return None
    names = quantized_layers(model)
    encoder = encoder_linears(model)
    asym = sorted({bool(m.int8.asym) for m in encoder.values() if m.int8 is not None})
    return {"mode": "int8", "int8_path": int8_path(), "layers": len(names),
            "kept_fp32": sorted(n for n, m in encoder.items() if m.int8 is None),
            "asym": asym[0] if len(asym) == 1 else asym}
