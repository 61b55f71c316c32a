"""The op tests' cases come from each backend's declared capabilities: collected on a machine where the cuda
backend is available (simulated here: torch.cuda.is_available and every implementation's availability declared),
no parametrized case is one its backend cannot serve, and every parametrization over backends is derived
through fastenc.testing.cases (so the registry, not the test file, decides). FASTENC_TEST_BACKENDS selects."""
from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

import fastenc  # noqa: F401  (registers every op)
from fastenc import registry, testing

HERE = Path(__file__).parent
SELF = Path(__file__).name


def _simulate_gpu(monkeypatch):
    """A CUDA machine as the registry and the test modules see it: a device, every backend available."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for op in registry.ops():
        for name, impl in registry.impls(op).items():
            monkeypatch.setitem(registry._REGISTRY[op], name, dataclasses.replace(impl, available=None))
    monkeypatch.delenv(testing.TEST_BACKENDS_ENV, raising=False)
    monkeypatch.setattr(testing, "DERIVED", [])


def _import_fresh(path: Path):
    """Import a test module under a private name (its module-level case lists are built now)."""
    name = f"_simulated_gpu_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.modules.pop(name, None)
    return mod


def _parametrizations(mod):
    """(test name, [argnames], argvalues) of every parametrize mark on the module's test functions."""
    for name in dir(mod):
        fn = getattr(mod, name)
        if not (name.startswith("test_") and callable(fn)):
            continue
        for mark in getattr(fn, "pytestmark", []):
            if mark.name == "parametrize":
                names, values = mark.args[0], mark.args[1]
                names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
                yield name, names, list(values)


def _op_test_files():
    return sorted(p for p in HERE.glob("test_*.py") if p.name != SELF)


@pytest.fixture(scope="module")
def simulated():
    """The op test modules imported once on the simulated GPU machine, and the cases derived meanwhile; the
    simulation (cuda available, every backend available) stays on while the tests below check them."""
    with pytest.MonkeyPatch.context() as mp:
        _simulate_gpu(mp)
        mods = {p.stem: _import_fresh(p) for p in _op_test_files()}
        yield mods, list(testing.DERIVED)


def test_every_case_is_servable_on_a_gpu_machine(simulated):
    mods, derived = simulated
    assert derived, "no case was derived"
    bad = []
    for op, param, inputs in derived:
        backend = param.values[0]
        why = registry.impl(op, backend).not_supported_reasons(inputs)  # availability declared: capabilities only
        if why:
            bad.append(f"{op} {param.id}: {'; '.join(why)}")
    assert not bad, "cases their backend cannot serve:\n" + "\n".join(bad[:40])


def test_every_backend_parametrization_is_derived(simulated):
    """In every tests/ops/test_<op>.py, a backend list not from testing.cases (or a dtype parametrized apart from
    the backend) would let a case through that nobody asked the registry about."""
    mods, derived = simulated
    ours = {id(p) for _, p, _ in derived}
    offenders = []
    per_op = {f"test_{op}" for op in registry.ops()} & set(mods)
    assert len(per_op) >= 8, sorted(per_op)
    for stem, mod in mods.items():
        if stem not in per_op:  # cross-op files (opcheck on CPU tensors, dispatch, bad input) pick their own
            continue
        marks: dict[str, list] = {}
        for test, names, values in _parametrizations(mod):
            marks.setdefault(test, []).append(names)
            if "backend" in names:
                loose = [v for v in values if id(v) not in ours]
                if loose:
                    offenders.append(f"{stem}::{test}: {len(loose)} backend case(s) not derived, e.g. {loose[0]!r}")
        for test, groups in marks.items():
            with_backend = any("backend" in g for g in groups)
            if with_backend and any("dtype" in g and "backend" not in g for g in groups):
                offenders.append(f"{stem}::{test}: dtype parametrized apart from the backend")
    assert not offenders, "\n".join(offenders)


def test_cuda_cases_are_there_and_only_the_servable_ones(simulated):
    mods, derived = simulated
    # backward (<op>_bwd) and out= (<op>_out) ops run through their forward op's tests
    cuda_ops = {op for op in registry.ops() if "cuda" in registry.impls(op) and not op.endswith(("_bwd", "_out"))}
    by_op: dict[str, set] = {}
    for op, param, _ in derived:
        if param.values[0] == "cuda":
            by_op.setdefault(op, set()).add(param.id)
    assert cuda_ops <= set(by_op), f"ops without cuda cases: {sorted(cuda_ops - set(by_op))}"
    att = mods["test_attention"]
    ids = {p.id for p in att._cases()}
    # Declared: fp16/bf16, head dims 32/64/96/128.
    assert "cuda-bf16-d64-s129" in ids and "cuda-fp16-d128-s17" in ids
    assert not {i for i in ids if i.startswith("cuda-fp32-")}
    assert not {i for i in ids if i.startswith("cuda-") and any(f"-d{d}-" in i for d in (8, 40, 80, 256))}
    # Triton on a GPU: its full grid, bf16 included (the interpreter's bf16 limit does not apply).
    assert "triton-bf16-d80-s129" in ids and "triton-fp32-d256-s17" in ids
    # Every window (asymmetric, zero, clamped) on the cuda backend in both of its dtypes.
    win = {(p.values[1], p.values[2]) for p in att.WINDOW_CASES if p.values[0] == "cuda"}
    assert win == {(w, dt) for w in att.WINDOWS for dt in (torch.float16, torch.bfloat16)}
    # fp32-only tests leave cuda out of attention; ops that take fp32 on cuda keep it.
    fp32_attention = testing.backend_cases("attention", lambda b: att._inputs(b, torch.float32))
    assert "cuda" not in [p.values[0] for p in fp32_attention]
    assert "cuda" in [p.values[0] for p in mods["test_layer_norm"].FP32]


def test_without_a_gpu_no_cuda_case_is_collected(monkeypatch):
    monkeypatch.delenv(testing.TEST_BACKENDS_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for op in ("attention", "gelu", "merge_lora"):
        got = testing.backends_for(op)
        assert "cuda" not in got and "reference" in got


def test_selected_backends_env(monkeypatch):
    _simulate_gpu(monkeypatch)
    monkeypatch.setenv(testing.TEST_BACKENDS_ENV, "cuda")
    assert testing.backends_for("attention") == ["cuda"]
    monkeypatch.setenv(testing.TEST_BACKENDS_ENV, "triton, reference")
    assert testing.backends_for("gelu") == ["reference", "triton"]
    monkeypatch.setenv(testing.TEST_BACKENDS_ENV, "cuda")
    assert testing.backends_for("lora_linear") == []  # no cuda implementation: nothing to run
    monkeypatch.setenv(testing.TEST_BACKENDS_ENV, "gpu")
    with pytest.raises(ValueError, match="FASTENC_TEST_BACKENDS: unknown backend 'gpu'"):
        testing.backends_for("gelu")


def test_runs_on_states_the_device_rules(monkeypatch):
    triton = registry.impl("gelu", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert "TRITON_INTERPRET=1" in registry.runs_on(triton, "cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert registry.runs_on(triton, "cpu") is None
    assert "not a speed path" in registry.runs_on(triton, "cpu", for_speed=True)
    assert "not cpu" in registry.runs_on(registry.impl("gelu", "cuda"), "cpu")
    assert "not cuda" in registry.runs_on(registry.impl("gelu", "cpu"), "cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "no CUDA device" in registry.runs_on(registry.impl("gelu", "reference"), "cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert registry.runs_on(registry.impl("gelu", "cuda"), "cuda") is None
    assert registry.runs_on(triton, "cuda", for_speed=True) is None
