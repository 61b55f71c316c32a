"""The C++/OpenMP CPU kernels run serially below a work threshold (csrc/cpu/parallel.h) and as a team above it:
forward and backward of every op they serve, at a size on each side of the threshold, with 1 and 2 threads,
against autograd through the fp32 reference (the per-thread dw / db / dbias partial sums included)."""
import pytest
import torch

import fastenc
from fastenc import testing
from fastenc.reference import (attention_varlen_ref, geglu_ref, gelu_ref, layer_norm_ref, merge_lora_ref, rms_norm_ref,
                               rope_ref, swiglu_ref)
from fastenc.reference.rope import rope_cache

# rows x hidden: 17 x 384 = 6.5k elements (serial), 129 x 1001 = 129k (a team; 2^16 is the threshold)
SIZES = {"small": (17, 384), "large": (129, 1001)}
CASES = [pytest.param(size, threads, id=f"{size}-{threads}t") for size in SIZES for threads in (1, 2)]

pytestmark = pytest.mark.skipif("cpu" not in testing.backends_for("layer_norm"), reason="cpu backend not available")


@pytest.fixture
def threads(request):
    """torch.set_num_threads for the test (the extension shares torch's OpenMP runtime), restored after."""
    before = torch.get_num_threads()
    yield lambda n: torch.set_num_threads(n)
    torch.set_num_threads(before)


def _grads(fn, inputs, grads):
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = fn(*leaves)
    outs = out if isinstance(out, tuple) else (out,)
    return list(outs) + list(torch.autograd.grad(outs, leaves, grads[:len(outs)]))


def _check(ours, ref, inputs, grads, names):
    got, want = _grads(ours, inputs, grads), _grads(ref, inputs, grads)
    assert len(got) == len(want) == len(names)
    for g, w, name in zip(got, want, names):
        testing.assert_close(g, w, name=name)


@pytest.mark.parametrize("size, nthreads", CASES)
def test_layer_norm_residual(size, nthreads, threads):
    threads(nthreads)
    rows, n = SIZES[size]
    x, r, gy, gh = (testing.randn(rows, n) for _ in range(4))
    w, b = testing.randn(n), testing.randn(n)
    _check(lambda x, w, b, r: fastenc.ops.layer_norm(x, w, b, 1e-5, residual=r, backend="cpu"),
           lambda x, w, b, r: layer_norm_ref(x, w, b, 1e-5, r), [x, w, b, r], [gy, gh],
           ["y", "h", "dx", "dweight", "dbias", "dresidual"])


@pytest.mark.parametrize("size, nthreads", CASES)
def test_rms_norm(size, nthreads, threads):
    threads(nthreads)
    rows, n = SIZES[size]
    x, gy, w = testing.randn(rows, n), testing.randn(rows, n), testing.randn(n)
    _check(lambda x, w: fastenc.ops.rms_norm(x, w, 1e-6, backend="cpu"), lambda x, w: rms_norm_ref(x, w, 1e-6),
           [x, w], [gy], ["y", "dx", "dweight"])


@pytest.mark.parametrize("size, nthreads", CASES)
def test_gelu_bias(size, nthreads, threads):
    threads(nthreads)
    rows, n = SIZES[size]
    x, gy, b = testing.randn(rows, n), testing.randn(rows, n), testing.randn(n)
    out = testing.poison(torch.empty(rows, n))
    with torch.no_grad():  # every element written, into a NaN-filled out=
        testing.assert_close(fastenc.ops.gelu(x, b, backend="cpu", out=out), gelu_ref(x, b), name="out=")
    _check(lambda x, b: fastenc.ops.gelu(x, b, backend="cpu"), lambda x, b: gelu_ref(x, b), [x, b], [gy],
           ["y", "dx", "dbias"])


@pytest.mark.parametrize("size, nthreads", CASES)
def test_geglu(size, nthreads, threads):
    threads(nthreads)
    rows, n = SIZES[size]
    x, gy = testing.randn(rows, 2 * n), testing.randn(rows, n)
    _check(lambda x: fastenc.ops.geglu(x, backend="cpu"), lambda x: geglu_ref(x), [x], [gy], ["y", "dx"])


@pytest.mark.parametrize("size, nthreads", CASES)
def test_swiglu(size, nthreads, threads):
    threads(nthreads)
    rows, n = SIZES[size]
    x, gy = testing.randn(rows, 2 * n, scale=3.0), testing.randn(rows, n)
    _check(lambda x: fastenc.ops.swiglu(x, backend="cpu"), lambda x: swiglu_ref(x), [x], [gy], ["y", "dx"])
    gate, up = x[:, :n].contiguous(), x[:, n:].contiguous()
    _check(lambda g, u: fastenc.ops.swiglu(g, u, backend="cpu"), lambda g, u: swiglu_ref(g, u), [gate, up], [gy],
           ["y", "dgate", "dup"])


@pytest.mark.parametrize("size, nthreads", CASES)
def test_rope(size, nthreads, threads):
    threads(nthreads)
    tokens = {"small": 17, "large": 257}[size]  # x (4 + 2) heads x 64: 6.5k / 99k elements
    q, k = testing.randn(tokens, 4, 64), testing.randn(tokens, 2, 64)
    gq, gk = testing.randn(tokens, 4, 64), testing.randn(tokens, 2, 64)
    cos, sin = rope_cache(64, 300)
    pos = torch.randint(0, 300, (tokens,), generator=testing.generator())
    _check(lambda q, k: fastenc.ops.rope(q, k, cos, sin, position_ids=pos, backend="cpu"),
           lambda q, k: rope_ref(q, k, cos, sin, pos), [q, k], [gq, gk], ["q", "k", "dq", "dk"])


@pytest.mark.parametrize("size, nthreads", [pytest.param(s, t, id=f"{s}-{t}t") for s in ("small", "large")
                                            for t in (1, 2)])
def test_merge_lora(size, nthreads, threads):
    threads(nthreads)
    rows, cols, r = {"small": (37, 100, 8), "large": (515, 1001, 40)}[size]  # 30k / 20.6M FMAs (2^24: threshold)
    w, a, b = testing.randn(rows, cols), testing.randn(r, cols), testing.randn(rows, r)
    testing.assert_close(fastenc.ops.merge_lora(w, a, b, 0.5, backend="cpu"), merge_lora_ref(w, a, b, 0.5))


@pytest.mark.parametrize("size, nthreads", [pytest.param(s, t, id=f"{s}-{t}t") for s in ("small", "large")
                                            for t in (1, 2)])
@pytest.mark.parametrize("window", [None, (9, 4)], ids=["global", "window"])
def test_attention(size, nthreads, window, threads):
    """Varlen attention, forward and backward, serial below kParallelMinAttnFmas (2^20 multiply-adds) and a team
    above it: small = 2 x 32 head dims over sequences of 5 and 11 (~20k); large = 4 x 64 over 100 and 77 (8M forward)."""
    threads(nthreads)
    lens, heads, d = {"small": ([5, 11], 2, 32), "large": ([100, 77], 4, 64)}[size]
    cu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(len(lens))], dtype=torch.int32)
    t = sum(lens)
    q, k, v, go = (testing.randn(t, heads, d) for _ in range(4))
    _check(lambda q, k, v: fastenc.ops.attention(q, k, v, cu_seqlens=cu, max_seqlen=max(lens), window=window,
                                                 backend="cpu"),
           lambda q, k, v: attention_varlen_ref(q, k, v, cu, window=window or (-1, -1)), [q, k, v], [go],
           ["out", "dq", "dk", "dv"])
