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


def test_backend_allowed_follows_the_choice_in_force(monkeypatch):
    monkeypatch.delenv("FASTENC_BACKEND", raising=False)
    assert registry.backend_allowed("cpu") and registry.requested_backends() is None
    with fastenc.use_backend("reference"):
        assert not registry.backend_allowed("cpu") and registry.backend_allowed("reference")
    with fastenc.use_backend("cuda", "cpu"):
        assert registry.backend_allowed("cpu")
    monkeypatch.setenv("FASTENC_BACKEND", "reference")
    assert not registry.backend_allowed("cpu") and registry.requested_backends() == ("reference",)
    monkeypatch.setenv("FASTENC_BACKEND", "bogus")
    with pytest.raises(ValueError, match="FASTENC_BACKEND: unknown backend 'bogus'"):
        registry.backend_allowed("cpu")


def _packed_attention_expected(attn, x, lengths):
    """SelfAttention's output from plain torch: one F.linear for Wqkv, attention_ref per sequence, F.linear for Wo."""
    from fastenc.reference.attention import attention_ref

    t = x.shape[0]
    q, k, v = torch.nn.functional.linear(x.double(), attn.Wqkv.weight.double(), attn.Wqkv.bias.double()).view(
        t, 3, attn.heads, attn.head_dim).unbind(1)
    outs, start = [], 0
    for n in lengths:
        s = slice(start, start + n)
        outs.append(attention_ref(q[None, s], k[None, s], v[None, s])[0])
        start += n
    o = torch.cat(outs).reshape(t, attn.hidden)
    return torch.nn.functional.linear(o, attn.Wo.weight.double(), attn.Wo.bias.double())


@pytest.mark.parametrize("how", ["use_backend", "environment"])
def test_reference_choice_never_calls_the_extension(monkeypatch, how):
    """Under use_backend("reference") / FASTENC_BACKEND=reference the layers use no extension resource at all
    (no buffer from the cpu backend's cache, no load, no build)."""
    from fastenc import extension
    from fastenc.layers import Linear
    from fastenc.layers.attention import SelfAttention
    from fastenc.testing import assert_close, randn

    def forbidden(*args, **kwargs):
        raise AssertionError("the C++ extension was called under the reference backend")

    for name in ("load", "load_cuda", "buffer_empty", "cpu_available", "cuda_available"):
        monkeypatch.setattr(extension, name, forbidden)
    monkeypatch.setattr(extension._CPU, "module", type("Forbidden", (), {"__getattr__": forbidden})())
    hidden, heads, lengths = 384, 6, [1, 17]
    lin = Linear(hidden, 1000)
    attn = SelfAttention(hidden, heads)
    with torch.no_grad():
        for p in (lin.weight, lin.bias, attn.Wqkv.weight, attn.Wqkv.bias, attn.Wo.weight, attn.Wo.bias):
            p.copy_(randn(*p.shape, scale=hidden ** -0.5))
    x = randn(sum(lengths), hidden, seed=4)
    cu = torch.tensor([0, 1, 18], dtype=torch.int32)
    if how == "environment":
        monkeypatch.setenv("FASTENC_BACKEND", "reference")
        ctx = torch.no_grad()
    else:
        ctx = fastenc.use_backend("reference")
    with ctx, torch.inference_mode():
        y = lin(x)
        o = attn(x, cu, max(lengths))
    assert_close(y, torch.nn.functional.linear(x.double(), lin.weight.double(), lin.bias.double()))
    assert_close(o, _packed_attention_expected(attn, x, lengths))


def test_decision_is_remembered_per_input_facts(monkeypatch):
    """A repeated call with the same facts (dtype, device, shape, choice in force) asks no implementation again; a
    new shape, a use_backend choice, FASTENC_BACKEND or a swapped implementation is decided afresh."""
    import dataclasses

    monkeypatch.delenv("FASTENC_BACKEND", raising=False)
    name, calls = "_toy_remembered", []

    def check(inputs):
        calls.append(tuple(inputs["x"].shape))
        return [] if inputs["x"].shape[-1] % 2 == 0 else ["odd width"]

    registry.register(Impl(op=name, backend="reference", fn=lambda: 0, devices=("cpu",)))
    registry.register(Impl(op=name, backend="cpu", fn=lambda: 1, devices=("cpu",), priority=20, check=check))
    try:
        assert [pick(name, torch.ones(3, 4)) for _ in range(3)] == ["cpu"] * 3
        assert calls == [(3, 4)]
        assert pick(name, torch.ones(3, 5)) == "reference" and calls == [(3, 4), (3, 5)]
        with fastenc.use_backend("reference"):
            assert pick(name, torch.ones(3, 4)) == "reference"
        monkeypatch.setenv("FASTENC_BACKEND", "reference")
        assert pick(name, torch.ones(3, 4)) == "reference"
        monkeypatch.delenv("FASTENC_BACKEND")
        assert pick(name, torch.ones(3, 4)) == "cpu" and calls == [(3, 4), (3, 5)]
        impl = registry.impl(name, "cpu")
        monkeypatch.setitem(registry._REGISTRY[name], "cpu", dataclasses.replace(impl, available=lambda: "gone"))
        with pytest.warns(RuntimeWarning, match="falls back to reference: cpu: gone"):
            assert pick(name, torch.ones(3, 4)) == "reference"
        monkeypatch.setattr(registry, "_WARNED", set())
        with pytest.warns(RuntimeWarning, match="falls back"):  # remembered, and still warned once per fresh set
            assert pick(name, torch.ones(3, 4)) == "reference"
        with pytest.raises(ValueError, match="backend argument \\['cpu'\\] cannot serve.*gone"):
            pick(name, torch.ones(3, 4), backend="cpu")  # errors are never remembered: raised every call
        with pytest.raises(ValueError, match="gone"):
            pick(name, torch.ones(3, 4), backend="cpu")
    finally:
        registry._REGISTRY.pop(name)
