"""The backends as declared in fastenc.backends: the registry's names and device rules come from the declarations,
the reference backend serves any device, and an implementation built by ops._backends.implement carries its
backend's devices, priority, availability and check."""
import dataclasses

import pytest
import torch

import fastenc  # noqa: F401 (registers the ops)
from fastenc import backends, registry, testing
from fastenc.ops import _backends


def test_registry_names_are_the_declared_backends_in_order():
    declared = backends.declared()
    assert registry.BACKENDS == tuple(b.name for b in declared)
    assert [b.order for b in declared] == sorted(b.order for b in declared)
    assert set(registry.BACKENDS) >= {"reference", "triton", "cuda", "cpu"}
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        backends.get("tpu")


def test_every_implementation_takes_its_backends_devices():
    for op in registry.ops():
        for name, impl in registry.impls(op).items():
            assert impl.devices == backends.get(name).devices, (op, name)


def test_reference_serves_any_device():
    assert registry.runs_on(registry.impl("gelu", "reference"), "meta") is None
    x = torch.empty(4, 8, device="meta")
    assert registry.select("gelu", {"x": x, "bias": None}).backend == "reference"
    for name in ("cpu", "cuda"):
        assert "not meta" in registry.runs_on(registry.impl("gelu", name), "meta")


def test_device_rules_come_from_the_declaration(monkeypatch):
    impl = registry.impl("gelu", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert registry.runs_on(impl, "cpu") == backends.get("triton").device_rule("cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert registry.runs_on(impl, "cpu") is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert registry.runs_on(impl, "cuda") == "no CUDA device visible to torch"
    assert testing.device_for("cuda") == "cuda" and testing.device_for("reference") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert testing.device_for("reference") == "cuda" and testing.device_for("cpu") == "cpu"


def test_implement_builds_from_the_declaration(monkeypatch):
    triton = backends.get("triton")
    seen = []
    impl = _backends.implement("_declared_toy", "triton", "math", "sqrt", check=lambda inputs: seen.append(1) or ["own"])
    try:
        assert impl.priority == triton.priority and impl.auto_devices == triton.auto_devices
        assert impl.limits == triton.limits and impl.available is triton.available
        assert impl.fn(4.0) == 2.0  # resolved lazily: math.sqrt
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        reasons = impl.check({"x": torch.ones(2)})
        assert reasons[0] == triton.check({"x": torch.ones(2)})[0] and reasons[-1] == "own" and seen == [1]
        ref = _backends.implement("_declared_toy", "reference", abs, priority=5)
        assert ref.fn(-3) == 3 and ref.priority == 5 and ref.devices == (backends.ANY,)
        assert dataclasses.replace(ref, available=None).not_supported_reasons({"x": torch.ones(2, device="meta")}) == []
    finally:
        registry._REGISTRY.pop("_declared_toy")
