"""dropout (counter-based keep-mask, optional fused bias), forward and backward: every backend against the reference,
the reference's mask against its definition (fastenc/reference/attention_dropout.py at head 0) and its keep rate."""
import importlib.util
import itertools

import pytest
import torch

import fastenc
from fastenc import testing
from fastenc.reference.attention_dropout import keep_mask
from fastenc.reference.dropout import dropout_bwd_ref, dropout_keep_ref, dropout_ref

OP = "dropout"
BACKENDS = testing.backends_for(OP)
# odd widths; (129, 1001) is misaligned for every vector width; (2, 3, 1152) has extra leading dims
SHAPES = [(1, 384), (17, 1000), (2, 3, 1152), (129, 1001)]


def _x(backend, dtype=torch.float32, shape=(2, 384)):
    return {"x": testing.fake(*shape, dtype=dtype, device=testing.device_for(backend))}


CASES = testing.cases(OP, itertools.product(BACKENDS, testing.DTYPES, SHAPES, (False, True), (0.1, 0.5)),
                      lambda be, dt, sh, bias, p: _x(be, dt, sh),
                      ids=lambda be, dt, sh, bias, p: f"{be}-{testing.dtype_id(dt)}-{testing.shape_id(sh)}-p{p}"
                                                      f"{'-bias' if bias else ''}")
FP32 = testing.backend_cases(OP, _x)


def _seeded(seed: int):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("backend,dtype,shape,bias,p", CASES)
def test_dropout_forward_backward(backend, dtype, shape, bias, p):
    dev = testing.device_for(backend)
    x = testing.randn(*shape, dtype=dtype, device=dev).requires_grad_(True)
    b = testing.randn(shape[-1], dtype=dtype, device=dev).requires_grad_(True) if bias else None
    gen_seed = testing.next_seed()
    out = fastenc.ops.dropout(x, p, bias=b, generator=_seeded(gen_seed), backend=backend)
    seed, offset = torch.randint(0, 2 ** 63 - 1, (2,), generator=_seeded(gen_seed), dtype=torch.int64).tolist()
    n = shape[-1]
    x2 = x.detach().reshape(-1, n)
    ref32 = dropout_ref(x2.float(), p, seed, offset, None if b is None else b.detach().float())
    lowp = dropout_ref(x2, p, seed, offset, None if b is None else b.detach()) if dtype != torch.float32 else None
    assert out.dtype == dtype and out.shape == x.shape
    testing.assert_close(out.reshape(-1, n), ref32, lowp, name="out")
    g = testing.randn(*shape, dtype=dtype, device=dev)
    out.backward(g)
    g2 = g.reshape(-1, n)
    dx32 = dropout_bwd_ref(g2.float(), p, seed, offset)
    dx_lowp = dropout_bwd_ref(g2, p, seed, offset) if dtype != torch.float32 else None
    testing.assert_close(x.grad.reshape(-1, n), dx32, dx_lowp, name="dx")
    if bias:
        assert b.grad.dtype == dtype
        testing.assert_close(b.grad, dx32.sum(0), None if dx_lowp is None else dx_lowp.float().sum(0), name="dbias")


def test_reference_mask_is_the_attention_mask_at_head_0_and_keeps_1_minus_p():
    seed, offset, p = 123456789012345, -987654321, 0.3
    keep = dropout_keep_ref(seed, offset, p, 37, 515)
    want = keep_mask(seed, offset, p, 1, torch.arange(37), torch.arange(515))[0]
    assert torch.equal(keep, want)
    rate = keep.float().mean().item()
    assert abs(rate - 0.7) < 0.01, rate
    # scaled output: kept elements are x / (1 - p), dropped ones 0
    x = torch.rand(37, 515) + 1.0
    out = dropout_ref(x, p, seed, offset)
    assert torch.equal(out == 0, ~keep)
    torch.testing.assert_close(out[keep], x[keep] / 0.7)


@pytest.mark.parametrize("backend", FP32)
def test_dropout_reproducible_and_fresh(backend):
    dev = testing.device_for(backend)
    x = testing.randn(9, 1000, device=dev)
    a = fastenc.ops.dropout(x, 0.2, generator=_seeded(5), backend=backend)
    b = fastenc.ops.dropout(x, 0.2, generator=_seeded(5), backend=backend)
    c = fastenc.ops.dropout(x, 0.2, generator=_seeded(6), backend=backend)
    assert torch.equal(a, b) and not torch.equal(a, c)
    torch.testing.assert_close(fastenc.ops.dropout(x, 0.0, backend=backend), x, rtol=0, atol=0)


def test_default_seed_comes_from_the_cpu_generator_whatever_the_device(monkeypatch):
    """With no generator given, (seed, offset) are drawn on torch's default CPU generator (torch.manual_seed makes
    a run reproducible) and never on a GPU's, which would synchronize the device at every call."""
    from fastenc.ops import _common

    torch.manual_seed(123)
    want = tuple(torch.randint(0, 2 ** 63 - 1, (2,), dtype=torch.int64).tolist())
    devices = []
    real = torch.randint

    def spy(*args, **kwargs):
        devices.append(torch.device(kwargs.get("device", "cpu")))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "randint", spy)
    torch.manual_seed(123)
    assert _common.draw_seed_offset(None) == want
    assert _common.draw_seed_offset(_seeded(4)) == tuple(real(0, 2 ** 63 - 1, (2,), generator=_seeded(4)).tolist())
    assert devices == [torch.device("cpu")] * 2
    x = testing.randn(3, 40)
    torch.manual_seed(9)
    a = fastenc.ops.dropout(x, 0.3, backend="reference")
    torch.manual_seed(9)
    assert torch.equal(fastenc.ops.dropout(x, 0.3, backend="reference"), a)
    assert devices[2:] == [torch.device("cpu")] * 2


@pytest.mark.parametrize("backend", FP32)
def test_dropout_only_bias_needs_grad(backend):
    dev = testing.device_for(backend)
    x, b = testing.randn(5, 384, device=dev), testing.randn(384, device=dev).requires_grad_(True)
    out = fastenc.ops.dropout(x, 0.4, bias=b, generator=_seeded(1), backend=backend)
    g = testing.randn(5, 384, device=dev)
    out.backward(g)
    seed, offset = torch.randint(0, 2 ** 63 - 1, (2,), generator=_seeded(1), dtype=torch.int64).tolist()
    testing.assert_close(b.grad, dropout_bwd_ref(g, 0.4, seed, offset).sum(0), name="dbias")
    assert x.grad is None


def test_dropout_bad_input_names_the_argument():
    x = torch.randn(3, 8)
    with pytest.raises(ValueError, match="dropout_p"):
        fastenc.ops.dropout(x, 1.0)
    with pytest.raises(ValueError, match="dropout_p"):
        fastenc.ops.dropout(x, -0.1)
    with pytest.raises(ValueError, match="bias"):
        fastenc.ops.dropout(x, 0.1, bias=torch.randn(7))
    with pytest.raises(TypeError, match="generator"):
        fastenc.ops.dropout(x, 0.1, generator=3)
    with pytest.raises(TypeError, match="x"):
        fastenc.ops.dropout(torch.ones(3, 8, dtype=torch.int64), 0.1)


def test_layers_use_ops_dropout_where_a_kernel_of_ours_serves(monkeypatch):
    """fastenc.layers.dropout: ops.dropout on CPU fp32 (cpu kernel) and on a GPU with triton installed (Triton
    kernel); torch's F.dropout of x + bias otherwise (CPU half precision, a GPU without triton)."""
    from fastenc import registry
    from fastenc.layers import dropout as layer

    calls = []
    monkeypatch.setattr(layer.ops, "dropout", lambda x, p, bias=None: calls.append("ops") or x)
    monkeypatch.setattr(layer.F, "dropout", lambda x, p, training: calls.append("torch") or x)
    layer.dropout(torch.randn(2, 8), 0.1)
    layer.dropout(torch.randn(2, 8, dtype=torch.bfloat16), 0.1, bias=torch.zeros(8, dtype=torch.bfloat16))
    gpu = testing.fake(2, 8, dtype=torch.float16, device="cuda")
    layer.dropout(gpu, 0.1)
    monkeypatch.setattr(registry, "triton_available", lambda: "triton is not installed")
    layer.dropout(gpu, 0.1)
    want_gpu = "ops" if importlib.util.find_spec("triton") is not None else "torch"
    assert calls == ["ops", "torch", want_gpu, "torch"]
