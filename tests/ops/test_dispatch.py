"""Registry and dispatch: choice order, explicit choices that cannot serve, fallback warnings."""
import os
import warnings

import pytest
import torch

import fastenc
from fastenc import registry
from fastenc.registry import Impl


@pytest.fixture
def toy_op():
    """A throwaway op with three backends whose fns say who ran."""
    name = "_toy"
    registry.register(Impl(op=name, backend="reference", fn=lambda: "reference", devices=("cpu", "cuda")))
    registry.register(Impl(op=name, backend="cpu", fn=lambda: "cpu", devices=("cpu",), priority=20,
                           dtypes=(torch.float32,)))
    registry.register(Impl(op=name, backend="triton", fn=lambda: "triton", devices=("cuda", "cpu"),
                           auto_devices=("cuda",), priority=30))
    yield name
    registry._REGISTRY.pop(name)


def pick(op, x, backend=None):
    return registry.select(op, {"x": x}, backend).backend


def test_default_priority_skips_interpreter_backend_on_cpu(toy_op):
    assert pick(toy_op, torch.ones(2)) == "cpu"


def test_dtype_filter_falls_to_reference(toy_op):
    assert pick(toy_op, torch.ones(2, dtype=torch.float16)) == "reference"


def test_explicit_argument_wins(toy_op, monkeypatch):
    monkeypatch.setenv("FASTENC_BACKEND", "cpu")
    with fastenc.use_backend("cpu"):
        assert pick(toy_op, torch.ones(2), backend="reference") == "reference"


def test_context_beats_environment(toy_op, monkeypatch):
    monkeypatch.setenv("FASTENC_BACKEND", "cpu")
    with fastenc.use_backend("reference"):
        assert pick(toy_op, torch.ones(2)) == "reference"
    assert pick(toy_op, torch.ones(2)) == "cpu"


def test_environment_preference_list(toy_op, monkeypatch):
    monkeypatch.setenv("FASTENC_BACKEND", "cuda,reference")
    assert pick(toy_op, torch.ones(2)) == "reference"


def test_explicit_choice_that_cannot_serve_lists_every_reason(toy_op):
    with pytest.raises(ValueError) as e:
        pick(toy_op, torch.ones(2, dtype=torch.float16), backend=["cpu", "cuda"])
    msg = str(e.value)
    assert "cpu: dtype float16" in msg and "cuda: _toy has no cuda implementation" in msg


def test_unknown_backend_name_is_named():
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        fastenc.ops.gelu(torch.randn(3), backend="tpu")
    with pytest.raises(ValueError, match="use_backend: unknown backend"):
        with fastenc.use_backend("fast"):
            pass


def test_unavailable_backend_falls_back_with_one_warning():
    name = "_toy_fallback"
    registry.register(Impl(op=name, backend="reference", fn=lambda: 0, devices=("cpu",)))
    registry.register(Impl(op=name, backend="cpu", fn=lambda: 1, devices=("cpu",), priority=20,
                           available=lambda: "compiler exploded"))
    try:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            assert pick(name, torch.ones(1)) == "reference"
            assert pick(name, torch.ones(1)) == "reference"
        msgs = [str(x.message) for x in w if "falls back" in str(x.message)]
        assert len(msgs) == 1 and "compiler exploded" in msgs[0]
    finally:
        registry._REGISTRY.pop(name)


def test_every_op_has_a_reference_and_lists_in_info():
    rows = registry.info_table()
    for op in registry.ops():
        if op.startswith("_"):
            continue
        assert "reference" in registry.impls(op)
        assert {r[1] for r in rows if r[0] == op} == set(registry.BACKENDS)


def test_real_op_dispatches_explicit_reference():
    x = torch.randn(3, 5)
    y = fastenc.ops.gelu(x, backend="reference")
    torch.testing.assert_close(y, torch.nn.functional.gelu(x))
