"""torch.library.opcheck for every registered fastenc:: custom op on CPU (schema, fake kernel, autograd
registration, AOT dispatch), once per CPU backend of the op (reference, and cpu where registered).

Samples come from each op's tests/ops/op_samples/<op>.py (`opcheck_samples`), keyed by the op's schema argument
names, so an op registered without a sample, or whose schema gains an argument the sample lacks, fails instead of
going unchecked.
"""
import pytest
import torch

import fastenc.ops  # noqa: F401  (registers the ops)
import op_samples
from fastenc import registry, testing
from fastenc.backends import serves


def _samples() -> dict[str, list[dict]]:
    """custom op -> list of {argument name: value} (without `backend`): every op's opcheck_samples()
    (tests/ops/op_samples/<op>.py); small odd shapes, fp32 and bf16."""
    out: dict[str, list[dict]] = {}
    for mod in op_samples.modules().values():
        for name, samples in getattr(mod, "opcheck_samples", dict)().items():
            if name in out:
                raise ValueError(f"two sample modules give opcheck samples of fastenc::{name}")
            out[name] = samples
    return out


def _cpu_backends(op):
    return [b for b, impl in registry.impls(op).items() if b in ("reference", "cpu") and serves(impl.devices, "cpu")]


CASES = [pytest.param(op, be, id=f"{op}-{be}") for op in registry.ops() for be in _cpu_backends(op)]


def test_every_op_has_a_cpu_backend():
    assert {c.values[0] for c in CASES} == set(registry.ops())


@pytest.mark.parametrize("op,backend", CASES)
def test_opcheck(op, backend):
    samples = _samples()
    assert op in samples, f"fastenc::{op} has no opcheck sample: add opcheck_samples() to tests/ops/op_samples/"
    custom = getattr(torch.ops.fastenc, op).default
    names = [a.name for a in custom._schema.arguments]
    for sample in samples[op]:
        missing = [n for n in names if n != "backend" and n not in sample]
        assert not missing, f"fastenc::{op} sample lacks arguments {missing} (schema: {custom._schema})"
        args = tuple(backend if n == "backend" else sample[n] for n in names)
        torch.library.opcheck(custom, args)


def _out_samples():
    """The `out=` variants (mutating ops): (op, base op, sample), from each op's opcheck_out_samples()."""
    return [c for mod in op_samples.modules().values() for c in getattr(mod, "opcheck_out_samples", list)()]


@pytest.mark.parametrize("op,base,sample", [pytest.param(o, b, s, id=f"{o}-{i}") for i, (o, b, s)
                                            in enumerate(_out_samples())])
def test_opcheck_out_variants(op, base, sample):
    custom = getattr(torch.ops.fastenc, op).default
    names = [a.name for a in custom._schema.arguments]
    for backend in _cpu_backends(base):
        args = tuple(backend if n == "backend" else sample[n].clone() if isinstance(sample[n], torch.Tensor)
                     else sample[n] for n in names)
        torch.library.opcheck(custom, args)


def test_backward_through_an_op_raises_naming_it():
    x = testing.randn(5, 64).requires_grad_(True)
    y = fastenc.ops.merge_lora(x, testing.randn(4, 64), testing.randn(5, 4), 1.0, backend="reference")
    assert y.requires_grad  # the autograd kernel is registered (outside inference mode): no silent zero gradient
    with pytest.raises(RuntimeError, match="fastenc::merge_lora has no backward"):
        y.sum().backward()
    with torch.inference_mode():
        assert not fastenc.ops.gelu(x.detach(), backend="cpu").requires_grad


def test_ops_under_torch_compile_match_eager():
    # aot_eager runs the traced graph through the fake kernels and AOT dispatch without a C++ compile step;
    # the dispatch in the public functions (registry.select) traces too (tests/ops/test_compile.py: fullgraph).
    w, b = testing.randn(96), testing.randn(96)

    def block(x, r):
        y, h = fastenc.ops.layer_norm(x, w, b, residual=r)
        return fastenc.ops.gelu(y, bias=b), h

    compiled = torch.compile(block, backend="aot_eager")
    for n in (7, 13):  # a second shape: the recompiled graph must run too
        x, r = testing.randn(n, 96), testing.randn(n, 96)
        for got, want in zip(compiled(x, r), block(x, r)):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
