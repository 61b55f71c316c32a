"""What the registry and the backend declarations both read, free of either: the environment without exceptions,
the torch.compile helpers (is it tracing; a function dynamo keeps as a constant) and an op's primary tensor."""
from __future__ import annotations

import os
from typing import Any, Callable, Mapping

import torch


def traced_constant(fn: Callable) -> Callable:
    """Mark `fn` as torch.compiler.assume_constant_result does (the same attribute, set here so that importing
    fastenc does not import torch._dynamo): dynamo calls it once while tracing and keeps its result as a constant
    of the graph, with no guard on it. Outside tracing it is an ordinary call."""
    fn._dynamo_marked_constant = True  # type: ignore[attr-defined]
    return fn


def compiling() -> bool:
    return torch.compiler.is_compiling()


_ENVIRON_DATA = getattr(os.environ, "_data", None)  # os.environ's own store: a lookup without a KeyError
_ENVIRON_KEYS: dict[str, Any] = {}


def env(name: str) -> str:
    """os.environ.get(name, ""), without the exception os.environ.get raises and catches for a missing name
    (~10x cheaper); the same store os.environ writes, so a change at run time is seen at once."""
    if _ENVIRON_DATA is None:
        return os.environ.get(name, "")
    key = _ENVIRON_KEYS.get(name)
    if key is None:
        key = _ENVIRON_KEYS[name] = os.environ.encodekey(name)
    raw = _ENVIRON_DATA.get(key)
    return "" if raw is None else os.environ.decodevalue(raw)


def primary_tensor(inputs: Mapping[str, Any]) -> torch.Tensor | None:
    """The first tensor of an op's inputs: the one whose device and dtype decide which implementation serves."""
    for v in inputs.values():
        if isinstance(v, torch.Tensor):
            return v
    return None
