"""merge_lora: every backend against an fp64 merge under the tolerance rule; in place; bf16 error no larger
than PEFT's own bf16 merge; bad input."""
import pytest
import torch

from fastenc import ops, registry, testing
from fastenc.reference.merge_lora import merge_lora_ref

OP = "merge_lora"
# (out_features, in_features, rank): odd widths, rank 1..64, fused-QKV-like tall weights.
SHAPES = [(384, 384, 8), (1152, 384, 1), (37, 1000, 64), (17, 1152, 16)]
def _w(backend, dtype=torch.float32, shape=(33, 40, 4), device=None):
    """The call a case makes, described for the registry: weight (out, in) on the test device."""
    return {"weight": testing.fake(*shape[:2], dtype=dtype, device=device or testing.device_for(backend))}


CASES = testing.cases(OP, ((b, dt, s) for b in testing.backends_for(OP) for dt in testing.DTYPES for s in SHAPES),
                      _w, ids=lambda b, dt, s: f"{b}-{testing.dtype_id(dt)}-{s[0]}x{s[1]}-r{s[2]}")
BF16 = testing.backend_cases(OP, lambda b: _w(b, torch.bfloat16))


def _interp_bf16(backend, dtype):
    # The Triton interpreter truncates fp32->bf16 instead of rounding: allow one bf16 ulp there.
    return backend == "triton" and dtype == torch.bfloat16 and registry.interpreter_on()


def _tensors(out_f, in_f, r, dtype, device, adapter_dtype=None):
    adt = adapter_dtype or dtype
    w = testing.randn(out_f, in_f, dtype=dtype, device=device, scale=0.05)
    a = testing.randn(r, in_f, dtype=adt, device=device, scale=in_f ** -0.5)
    b = testing.randn(out_f, r, dtype=adt, device=device, scale=0.05)
    return w, a, b


def _ref64(w, a, b, scale):
    return merge_lora_ref(w.double(), a.double(), b.double(), scale)


@pytest.mark.parametrize("backend,dtype,shape", CASES)
def test_merge_lora_matches_reference(backend, dtype, shape):
    device = testing.device_for(backend)
    w, a, b = _tensors(*shape, dtype, device)
    scale = 16.0 / shape[2]
    w0 = w.clone()
    out = ops.merge_lora(w, a, b, scale, backend=backend)
    assert out.dtype == dtype and out.data_ptr() != w.data_ptr()
    assert torch.equal(w, w0), "out-of-place merge wrote into weight"
    extra = testing.bf16_ulp(_ref64(w, a, b, scale)) if _interp_bf16(backend, dtype) else 0.0
    testing.assert_close(out, _ref64(w, a, b, scale), merge_lora_ref(w, a, b, scale, upcast=False),
                         dtype=dtype, extra=extra)


@pytest.mark.parametrize("backend", BF16)
def test_merge_lora_inplace_and_mixed_dtypes(backend):
    """bf16 base weight, fp32 adapter (PEFT's usual storage); in place into an nn.Parameter."""
    device = testing.device_for(backend)
    w, a, b = _tensors(129, 384, 8, torch.bfloat16, device, adapter_dtype=torch.float32)
    expected = ops.merge_lora(w, a, b, 2.0, backend=backend)
    p = torch.nn.Parameter(testing.poison(torch.empty_like(w)))
    with torch.no_grad():
        p.copy_(w)
    got = ops.merge_lora(p, a, b, 2.0, backend=backend, inplace=True)
    assert got is p and p.requires_grad
    assert torch.equal(p.detach(), expected)
    extra = testing.bf16_ulp(_ref64(w, a, b, 2.0)) if _interp_bf16(backend, torch.bfloat16) else 0.0
    testing.assert_close(expected, _ref64(w, a, b, 2.0), merge_lora_ref(w, a.bfloat16(), b.bfloat16(), 2.0,
                                                                        upcast=False), extra=extra)


def _peft_gpu_merge_bf16(w, a, b, scale):
    """PEFT's merge of a bf16 adapter on a GPU (peft/tuners/lora/layer.py Linear.get_delta_weight and
    merge): delta = (B @ A) * scaling, each step in bf16, then W + delta in bf16 (three roundings)."""
    delta = (b @ a) * scale
    return w + delta


@pytest.mark.parametrize("backend", BF16)
def test_merge_lora_bf16_error_not_above_peft(backend):
    device = testing.device_for(backend)
    g = torch.Generator().manual_seed(1234)
    out_f, in_f, r, scale = 768, 768, 16, 2.0
    # Trained-adapter magnitudes: W ~ 0.04, delta comparable to W.
    w = (torch.randn(out_f, in_f, generator=g) * 0.04).bfloat16().to(device)
    a = (torch.randn(r, in_f, generator=g) * in_f ** -0.5).bfloat16().to(device)
    b = (torch.randn(out_f, r, generator=g) * 0.01).bfloat16().to(device)
    exact = _ref64(w, a, b, scale).cpu()
    ours = ops.merge_lora(w, a, b, scale, backend=backend).double().cpu()
    peft = _peft_gpu_merge_bf16(w.cpu(), a.cpu(), b.cpu(), scale).double()
    err_ours, err_peft = (ours - exact).abs(), (peft - exact).abs()
    slack = testing.bf16_ulp(exact) if _interp_bf16(backend, torch.bfloat16) else 0.0
    assert torch.isfinite(ours).all()
    assert float(err_ours.max()) <= float(err_peft.max()) + slack, (float(err_ours.max()), float(err_peft.max()))
    if not slack:  # one rounding: each element is the bf16 value nearest to the exact merge
        assert float(err_ours.mean()) < float(err_peft.mean())
        ulp_half = exact.abs() * 2.0 ** -8
        assert bool((err_ours <= ulp_half + 1e-30).all())


@pytest.mark.parametrize("backend", testing.cases(OP, [(b,) for b in testing.backends_for(OP)
                                                         if b in ("reference", "cpu")],
                                                   lambda b: _w(b, device="cpu"), ids=lambda b: b))
def test_merge_lora_opcheck(backend):
    w, a, b = _tensors(33, 40, 4, torch.float32, "cpu")
    torch.library.opcheck(torch.ops.fastenc.merge_lora.default, (w, a, b, 0.5, backend))


@pytest.mark.parametrize("make,match", [
    (lambda w, a, b: (w, a[:, :-1], b, 1.0), "lora_a must have shape"),
    (lambda w, a, b: (w, a, b[:, :-1], 1.0), "lora_b must have shape"),
    (lambda w, a, b: (w, a, b[:-1], 1.0), "lora_b must have shape"),
    (lambda w, a, b: (w[0], a, b, 1.0), "weight must be 2-D"),
    (lambda w, a, b: (w, a[:0], b[:, :0], 1.0), "rank >= 1"),
    (lambda w, a, b: (w, a, b, float("nan")), "scale must be a finite float"),
    (lambda w, a, b: (w.int(), a, b, 1.0), "weight must be float32"),
    (lambda w, a, b: (w, a[None], b, 1.0), "lora_a must be 2-D"),
], ids=["a-in", "b-rank", "b-out", "w-1d", "rank0", "scale-nan", "w-int", "a-3d"])
def test_merge_lora_bad_input(make, match):
    w, a, b = _tensors(12, 10, 3, torch.float32, "cpu")
    with pytest.raises((ValueError, TypeError), match=match):
        ops.merge_lora(*make(w, a, b))


@pytest.mark.parametrize("backend,dtype", testing.dtype_cases(OP, testing.DTYPES, _w))
@pytest.mark.parametrize("in_f", [1001, 1152], ids=lambda n: f"in{n}")
def test_merge_lora_misaligned(backend, dtype, in_f):
    """Width 1001 (no whole 8-element vectors per row) and a weight starting one element into its storage: the
    element-access path of the vectorized kernels, never a misaligned vector load."""
    device = testing.device_for(backend)
    w = testing.randn(37 * in_f + 1, dtype=dtype, device=device, scale=0.05)[1:].view(37, in_f)
    assert w.is_contiguous() and w.storage_offset() == 1
    _, a, b = _tensors(37, in_f, 8, dtype, device)
    out = ops.merge_lora(w, a, b, 2.0, backend=backend)
    extra = testing.bf16_ulp(_ref64(w, a, b, 2.0)) if _interp_bf16(backend, dtype) else 0.0
    testing.assert_close(out, _ref64(w, a, b, 2.0), merge_lora_ref(w, a, b, 2.0, upcast=False), dtype=dtype,
                         extra=extra)
