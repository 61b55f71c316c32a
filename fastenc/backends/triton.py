"""The triton backend: the Triton kernels of fastenc/kernels, picked on CUDA; CPU tensors run them under the Triton
interpreter (TRITON_INTERPRET=1), a test path that automatic selection never picks."""
from __future__ import annotations

import importlib.util
from typing import Any, Mapping

import torch

from fastenc.backends import Backend, lazy
from fastenc.backends._env import compiling, env, primary_tensor, traced_constant

NEEDS_INTERPRETER = "CPU tensors need TRITON_INTERPRET=1 (set before triton is imported)"


def triton_available() -> str | None:
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    return None


def interpreter_on() -> bool:
    if compiling():
        return _interpreter_traced()
    return env("TRITON_INTERPRET") not in ("", "0")


_interpreter_traced = traced_constant(lambda: env("TRITON_INTERPRET") not in ("", "0"))


def triton_check(inputs: Mapping[str, Any]) -> list[str]:
    """Every Triton implementation's check: CUDA tensors, or CPU tensors under TRITON_INTERPRET=1."""
    t = primary_tensor(inputs)
    if t is not None and t.device.type == "cpu" and not interpreter_on():
        return [NEEDS_INTERPRETER]
    return []


def _probe() -> str | None:
    why = triton_available()
    if why:
        return why
    if torch.cuda.is_available():
        return None
    return None if interpreter_on() else "no CUDA device (CPU tensors need TRITON_INTERPRET=1)"


def _device_rule(device: str) -> str | None:
    return NEEDS_INTERPRETER if device == "cpu" and not interpreter_on() else None


BACKEND = Backend(name="triton", order=1, devices=("cuda", "cpu"), resolve=lazy, priority=30,
                  auto_devices=("cuda",), test_devices=("cuda", "cpu"),
                  limits="CUDA; CPU tensors under TRITON_INTERPRET=1", available=triton_available, probe=_probe,
                  check=triton_check, device_rule=_device_rule)
