"""The op benchmark specs (fastenc/benchmark/ops): a spec module dropped into the package is found with no other
edit and flows into the kernel cases, the providers and the bytes/FLOPs model; every spec declares what the
harness asks of it."""
from __future__ import annotations

import textwrap

import pytest
import torch

import fastenc  # noqa: F401  (registers every op)
from fastenc import registry
from fastenc.benchmark import backward, kernels
from fastenc.benchmark import ops as op_specs

TOY = '''
import torch
from fastenc.benchmark.ops._common import MEMORY, Case, OpInputs, rand

OP, ORDER, BOUND = "toy_scale", 1000, MEMORY
BASELINES = ("torch-eager",)


def cases():
    return [Case(OP, "toy 2x8 n16", "toy", [8, 8], {"n": 16}, quick=True)]


def sweep(seq):
    return [Case(OP, f"toy long 1x{seq}", "sweep", [seq], {"n": 16})]


def work(case, e):
    return 2 * case.tokens * case.dims["n"] * e, case.tokens * case.dims["n"]


def setup(case, dev, dtype, g, seed):
    x = rand(case.tokens, case.dims["n"], device=dev, dtype=dtype, gen=g)
    return OpInputs(lambda be: (lambda: x * 2), {"x": x}, {"torch-eager": lambda: x * 2}, None)
'''


@pytest.fixture
def toy_spec(tmp_path, monkeypatch):
    (tmp_path / "toy_scale.py").write_text(textwrap.dedent(TOY))
    monkeypatch.setattr(op_specs, "__path__", [*op_specs.__path__, str(tmp_path)])
    monkeypatch.setattr(op_specs, "_SPECS", None)
    monkeypatch.setitem(registry._REGISTRY, "toy_scale", {})  # an op with no backend yet
    yield
    monkeypatch.setattr(op_specs, "_SPECS", None)


def test_a_new_spec_module_is_found_by_iterating_the_package(toy_spec):
    assert list(op_specs.specs())[-1] == "toy_scale"  # ORDER 1000: after the others
    quick = [c for c in kernels.cases(quick=True) if c.op == "toy_scale"]
    assert [c.shape for c in quick] == ["toy 2x8 n16"]
    full = [c.shape for c in kernels.cases() if c.op == "toy_scale"]
    assert full == ["toy 2x8 n16"] + [f"toy long 1x{s}" for s in (512, 1024, 2048, 4096)]
    assert kernels.work(quick[0], torch.float16) == (2 * 16 * 16 * 2, 16 * 16) and kernels.bound(quick[0]) == "memory"
    assert kernels.provider_names("toy_scale", "cpu") == ["torch-eager", "torch-compile"]  # no backend registered
    st = kernels.setup(kernels.tiny(quick[0]), "cpu", torch.float32)
    assert set(st.others) == {"torch-eager"} and st.skipped["torch-compile"] == "no reference function to compile"
    assert "toy_scale" not in op_specs.backward_specs()  # no backward_case: not in --backward
    assert [c.op for c in kernels.select_cases(quick=True, ops=["toy_scale"])] == ["toy_scale"]


def test_every_spec_declares_what_the_harness_asks():
    specs = op_specs.specs()
    assert {"layer_norm", "rms_norm", "gelu", "geglu", "swiglu", "dropout", "rope", "attention", "merge_lora",
            "lora_linear"} <= set(specs)
    for op, spec in specs.items():
        assert spec.OP == op and spec.BOUND in ("memory", "compute")
        cases = spec.cases()
        assert cases and all(c.op == op for c in cases) and any(c.quick for c in cases), op
        for c in cases:
            nbytes, flops = spec.work(c, 4)
            assert nbytes > 0 and flops > 0, (op, c.shape)
    assert [c.op for c in backward.backward_cases(quick=True)] == [
        "attention", "layer_norm", "rms_norm", "gelu", "geglu", "swiglu", "rope", "lora_linear"]
    with pytest.raises(ValueError, match="no benchmark spec for op 'softmax'"):
        op_specs.spec("softmax")
