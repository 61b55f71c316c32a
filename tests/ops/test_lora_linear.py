"""lora_linear: every backend against the fp32 reference under the tolerance rule; bias/no bias; leading dims;
rank limits; bad input."""
import pytest
import torch

from fastenc import ops, registry, testing
from fastenc.reference.lora_linear import lora_linear_ref

OP = "lora_linear"
# (tokens, in_features, out_features, rank); 300x384x200 takes the CPU backend's many-tokens schedule.
SHAPES = [(1, 384, 1152, 8), (17, 1000, 384, 1), (129, 384, 1000, 64), (17, 1152, 384, 16), (300, 384, 200, 16)]


def _dtypes(backend):
    # bf16 tl.dot is wrong in the Triton interpreter: bf16 Triton runs on a GPU only.
    if backend == "triton" and registry.interpreter_on():
        return (torch.float32, torch.float16)
    return testing.DTYPES


def _inputs(backend, dtype=torch.float32, shape=(7, 24, 16, 4), device=None):
    """The call a case makes, described for the registry: x (tokens, in), lora_a (rank, in) on the test device."""
    tokens, in_f, out_f, r = shape
    dev = device or testing.device_for(backend)
    return {"x": testing.fake(tokens, in_f, dtype=dtype, device=dev),
            "weight": testing.fake(out_f, in_f, dtype=dtype, device=dev),
            "lora_a": testing.fake(r, in_f, dtype=dtype, device=dev),
            "lora_b": testing.fake(out_f, r, dtype=dtype, device=dev)}


CASES = testing.cases(OP, ((b, dt, s) for b in testing.backends_for(OP) for dt in _dtypes(b) for s in SHAPES),
                      _inputs, ids=lambda b, dt, s: f"{b}-{testing.dtype_id(dt)}-{s[0]}x{s[1]}x{s[2]}-r{s[3]}")


def _tensors(tokens, in_f, out_f, r, dtype, device, bias=True):
    x = testing.randn(tokens, in_f, dtype=dtype, device=device)
    w = testing.randn(out_f, in_f, dtype=dtype, device=device, scale=in_f ** -0.5)
    bb = testing.randn(out_f, dtype=dtype, device=device) if bias else None
    a = testing.randn(r, in_f, dtype=dtype, device=device, scale=in_f ** -0.5)
    b = testing.randn(out_f, r, dtype=dtype, device=device, scale=0.5)
    return x, w, bb, a, b


def _check(out, x, w, bb, a, b, scale, dtype):
    up = [None if t is None else t.float() for t in (x, w, bb, a, b)]
    ref32 = lora_linear_ref(*up, scale)
    testing.assert_close(out, ref32, lora_linear_ref(x, w, bb, a, b, scale, upcast=False), dtype=dtype)
    # The adapter must matter: the same output without it is far off.
    assert float((ref32 - lora_linear_ref(*up[:3], up[3], up[4] * 0, scale)).abs().max()) > 0.1


@pytest.mark.parametrize("backend,dtype,shape", CASES)
def test_lora_linear_matches_reference(backend, dtype, shape):
    device = testing.device_for(backend)
    x, w, bb, a, b = _tensors(*shape, dtype, device)
    scale = 2.0
    out = ops.lora_linear(x, w, bb, a, b, scale, backend=backend)
    assert out.dtype == dtype and out.shape == (shape[0], shape[2])
    _check(out, x, w, bb, a, b, scale, dtype)


@pytest.mark.parametrize("backend", testing.backend_cases(OP, lambda b: _inputs(b, shape=(18, 384, 200, 4))))
def test_lora_linear_no_bias_leading_dims(backend):
    device = testing.device_for(backend)
    x, w, _, a, b = _tensors(2 * 9, 384, 200, 4, torch.float32, device, bias=False)
    x3 = x.view(2, 9, 384)
    out = ops.lora_linear(x3, w, None, a, b, 0.25, backend=backend)
    assert out.shape == (2, 9, 200)
    _check(out.view(18, 200), x, w, None, a, b, 0.25, torch.float32)


def test_lora_linear_rank_limits():
    x, w, bb, a, b = _tensors(5, 64, 48, 200, torch.float32, "cpu")
    out = ops.lora_linear(x, w, bb, a, b, 1.0, backend="reference")
    _check(out, x, w, bb, a, b, 1.0, torch.float32)
    if "triton" in testing.backends_for(OP):
        with pytest.raises(ValueError, match="rank 200 > 64 for float32"):
            ops.lora_linear(x, w, bb, a, b, 1.0, backend="triton")


@pytest.mark.parametrize("backend", testing.cases(OP, [(b,) for b in testing.backends_for(OP)
                                                         if b in ("reference", "cpu")],
                                                   lambda b: _inputs(b, device="cpu"), ids=lambda b: b))
def test_lora_linear_opcheck(backend):
    x, w, bb, a, b = _tensors(7, 24, 16, 4, torch.float32, "cpu")
    torch.library.opcheck(torch.ops.fastenc.lora_linear.default, (x, w, bb, a, b, 0.5, backend))
    torch.library.opcheck(torch.ops.fastenc.lora_linear.default, (x, w, None, a, b, 0.5, backend))


@pytest.mark.parametrize("make,match", [
    (lambda x, w, bb, a, b: (x[:, :-1], w, bb, a, b, 1.0), "x's last dim"),
    (lambda x, w, bb, a, b: (x, w, bb, a[:, :-1], b, 1.0), "lora_a must have shape"),
    (lambda x, w, bb, a, b: (x, w, bb, a, b[:, :-1], 1.0), "lora_b must have shape"),
    (lambda x, w, bb, a, b: (x, w, bb, a, b[:-1], 1.0), "lora_b must have shape"),
    (lambda x, w, bb, a, b: (x, w, bb[:-1], a, b, 1.0), "bias must have shape"),
    (lambda x, w, bb, a, b: (x, w.double(), bb, a, b, 1.0), "weight must be float32"),
    (lambda x, w, bb, a, b: (x, w.half(), bb, a, b, 1.0), "weight must have x's dtype"),
    (lambda x, w, bb, a, b: (x, w, bb, a.half(), b, 1.0), "lora_a must have x's dtype"),
    (lambda x, w, bb, a, b: (x, w, bb, a, b, float("inf")), "scale must be a finite float"),
    (lambda x, w, bb, a, b: (x, w, bb, a, b, "2"), "scale must be a finite float"),
], ids=["x-in", "a-in", "b-rank", "b-out", "bias", "w-fp64", "w-dtype", "a-dtype", "scale-inf", "scale-str"])
def test_lora_linear_bad_input(make, match):
    t = _tensors(6, 10, 12, 3, torch.float32, "cpu")
    with pytest.raises((ValueError, TypeError), match=match):
        ops.lora_linear(*make(*t))
