"""Property tests of a cu_seqlens changed in place between calls, for every op whose samples
(tests/ops/op_samples/<op>.py) declare `cu_seqlens_call`.

A cu_seqlens tensor rewritten through a numpy view or through .data keeps its _version: a second call must still
compute on the new split (or refuse invalid values with an error naming cu_seqlens), never reuse what it derived
from the old values, never read or write out of bounds. Invalid values on a device backend run in a fresh
interpreter, so an out-of-bounds access cannot take the test session down.
"""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from hypothesis import strategies as st

import op_samples
from fastenc import testing
from op_samples._draw import INTERP, Data, cu_tensor, draw_split, run

SAMPLES = {op: mod for op, mod in op_samples.modules().items() if hasattr(mod, "cu_seqlens_call")}


def _rewrite(cu: torch.Tensor, values: list[int], how: str) -> None:
    """Write `values` into cu without bumping cu._version: through a numpy view or through .data."""
    version = cu._version
    if how == "numpy":
        torch.from_numpy(cu.numpy())[:] = torch.tensor(values, dtype=torch.int32)
    else:
        cu.data.copy_(torch.tensor(values, dtype=torch.int32))
    assert cu._version == version and cu.tolist() == values  # the case under test: same tensor, same version


def _invalid(draw, cu: list[int]) -> list[int]:
    """Values of cu's length that cu_seqlens validation must refuse."""
    total, n = cu[-1], len(cu)
    kind = draw(st.sampled_from(("past the end", "short of the end", "decreasing", "negative start")),
                label="invalid kind")
    bad = list(cu)
    if kind == "past the end":
        bad[-1] = total + draw(st.integers(1, 50), label="excess")
    elif kind == "short of the end":
        bad[-1] = total - draw(st.integers(1, total), label="shortfall")
    elif kind == "decreasing":
        bad[n // 2] = total + 7
    else:
        bad[0] = -draw(st.integers(1, 5), label="start")
    return bad


def _inplace_case(draw, backend, op: str, how: str, invalid: bool):
    d = Data(draw, backend)
    total = draw(st.integers(1, 40 if backend == "triton" and INTERP else 100), label="tokens")
    first = draw_split(draw, total, "first")
    second = _invalid(draw, first) if invalid else draw_split(draw, total, "second", len(first) - 1)
    cu = cu_tensor(first, d.device)
    call, check = SAMPLES[op].cu_seqlens_call(d, total, cu)
    check(call(), first)
    _rewrite(cu, second, how)
    if invalid:
        with pytest.raises((ValueError, RuntimeError), match="cu_seqlens"):
            call()
    else:
        check(call(), second)


def _params(ops) -> list:
    """(op, backend, how); the numpy view exists for CPU tensors only."""
    return [pytest.param(op, be, how, id=f"{op}-{be}-{how}") for op in ops for be in testing.backends_for(op)
            for how in ("numpy", "data") if how == "data" or testing.device_for(be) == "cpu"]


def _isolated(fn: str, *args) -> None:
    """Run fn(*args) of this file in a fresh interpreter: an out-of-bounds access there must not take the test
    session down. Passes when it returns normally."""
    code = ("import importlib.util, os, sys; sys.path.insert(0, os.path.dirname(sys.argv[1])); "
            "s = importlib.util.spec_from_file_location('props', sys.argv[1]); "
            "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); getattr(m, sys.argv[2])(*sys.argv[3:])")
    proc = subprocess.run([sys.executable, "-c", code, __file__, fn, *args], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, f"{fn}{args} exited with {proc.returncode}:\n{(proc.stdout + proc.stderr)[-3000:]}"


def inplace_property(backend: str, op: str, how: str, invalid: str, examples: str = "0") -> None:
    run(backend, lambda draw, be: _inplace_case(draw, be, op, how, invalid == "invalid"), int(examples) or None)


def _inplace_test(backend, op, how, invalid):
    if backend in ("triton", "cuda") and invalid:  # a device kernel fed bad offsets may corrupt the process
        _isolated("inplace_property", backend, op, how, "invalid", "4")
    else:
        inplace_property(backend, op, how, "invalid" if invalid else "valid")


@pytest.mark.parametrize("op,backend,how", _params(SAMPLES))
def test_cu_seqlens_changed_in_place(op, backend, how):
    """Drawn splits of at most 40 tokens under the interpreter (one attention query tile): the tile-crossing case
    is test_attention_longest_sequence_grows_in_place."""
    _inplace_test(backend, op, how, False)


@pytest.mark.parametrize("op,backend,how", _params(SAMPLES))
def test_cu_seqlens_invalid_in_place(op, backend, how):
    _inplace_test(backend, op, how, True)


@pytest.mark.parametrize("op,backend,how", _params(("attention",)))
def test_attention_longest_sequence_grows_in_place(op, backend, how):
    """Five sequences of 20 tokens rewritten in place to four empty ones and one of 100 (past a 64-query tile)."""
    d = Data(lambda strategy, label=None: 0, backend)  # no draws: every one takes 0 (seed 0, separate q/k/v)
    first, second = [0, 20, 40, 60, 80, 100], [0, 0, 0, 0, 0, 100]
    cu = cu_tensor(first, d.device)
    call, check = SAMPLES[op].cu_seqlens_call(d, 100, cu)
    check(call(), first)
    _rewrite(cu, second, how)
    check(call(), second)
