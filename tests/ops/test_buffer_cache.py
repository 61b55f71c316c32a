"""The CPU buffer cache (csrc/cpu/buffer_cache.h): large outputs of the cpu backend and of fastenc.layers.Linear
are reused after they are freed, never while alive, and the memory it holds stays bounded."""
from __future__ import annotations

import threading

import pytest
import torch

import fastenc
from fastenc import extension, testing
from fastenc.layers import Linear
from fastenc.reference.gelu import gelu_ref

BIG = (257, 1000)  # 1 MB in fp32: above the 64 KiB the cache starts at


@pytest.fixture(autouse=True)
def fresh_cache():
    extension.load()
    extension.set_buffer_cache(True)
    extension.empty_cache()
    yield
    extension.set_buffer_cache(True)


def test_freed_output_is_reused_and_rewritten():
    x1, x2 = torch.randn(BIG), torch.randn(BIG)
    y = fastenc.ops.gelu(x1, backend="cpu")
    ptr = y.data_ptr()
    y.fill_(float("nan"))
    del y
    before = extension.buffer_cache_stats()
    y2 = fastenc.ops.gelu(x2, backend="cpu")
    after = extension.buffer_cache_stats()
    assert y2.data_ptr() == ptr, "a freed block of the same size should be handed out again"
    assert after["hits"] == before["hits"] + 1
    testing.assert_close(y2, gelu_ref(x2))


def test_live_outputs_never_share_memory():
    xs = [torch.randn(BIG) for _ in range(4)]
    ys = [fastenc.ops.gelu(x, backend="cpu") for x in xs]
    assert len({y.data_ptr() for y in ys}) == len(ys)
    for x, y in zip(xs, ys):  # later calls did not write into earlier outputs
        testing.assert_close(y, gelu_ref(x))
    stats = extension.buffer_cache_stats()
    assert stats["in_use_bytes"] >= 4 * BIG[0] * BIG[1] * 4


def test_linear_output_from_cache_matches_torch():
    lin = Linear(384, 1152).requires_grad_(False)  # frozen, grad mode on: the cache path (not autograd's, not
    torch.nn.init.normal_(lin.weight)               # the packed GEMM, which runs only with grad mode off)
    torch.nn.init.normal_(lin.bias)
    x = torch.randn(129, 384)
    before = extension.buffer_cache_stats()["in_use_bytes"]
    y = lin(x)
    assert extension.buffer_cache_stats()["in_use_bytes"] > before
    torch.testing.assert_close(y, torch.nn.functional.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-4)
    y_nb = lin(x, with_bias=False)
    torch.testing.assert_close(y_nb, x @ lin.weight.t(), rtol=1e-5, atol=1e-4)


def test_empty_cache_and_disable():
    y = fastenc.ops.gelu(torch.randn(BIG), backend="cpu")
    del y
    assert extension.buffer_cache_stats()["cached_bytes"] > 0
    fastenc.empty_cache()
    assert extension.buffer_cache_stats()["cached_bytes"] == 0
    extension.set_buffer_cache(False)
    before = extension.buffer_cache_stats()
    y = fastenc.ops.gelu(torch.randn(BIG), backend="cpu")
    assert extension.buffer_cache_stats()["in_use_bytes"] == before["in_use_bytes"]
    assert extension.buffer_empty((4, 4), y) is None


def test_memory_held_stays_bounded_when_shapes_change():
    g = torch.Generator().manual_seed(0)
    peak_live = 0
    for _ in range(40):
        rows = int(torch.randint(40, 600, (1,), generator=g))
        live = [fastenc.ops.gelu(torch.randn(rows, 1000), backend="cpu") for _ in range(3)]
        peak_live = max(peak_live, sum(t.numel() * 4 for t in live))
        del live
    s = extension.buffer_cache_stats()
    assert s["in_use_bytes"] == 0
    # blocks are 4 KiB-rounded and may be a quarter larger than asked; the cache trims at twice the peak in use
    assert s["cached_bytes"] <= 2 * s["peak_in_use_bytes"]
    assert s["peak_in_use_bytes"] <= 1.25 * peak_live + 3 * 4096


def test_threads_share_the_cache_safely():
    xs = [torch.randn(BIG) for _ in range(4)]
    refs = [fastenc.ops.gelu(x, backend="cpu").clone() for x in xs]  # each computed alone
    for x, ref in zip(xs, refs):
        testing.assert_close(ref, gelu_ref(x))
    errors = []

    def work(i):
        for _ in range(20):
            y = fastenc.ops.gelu(xs[i], backend="cpu")
            if not torch.equal(y, refs[i]):  # the kernel is deterministic: any other bit is another call's write
                errors.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
