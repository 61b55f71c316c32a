"""fastenc.layers.embedding: F.embedding's value and gradient, the weight's gradient in a buffer-cache block that is
handed out again once the previous step's gradient is freed, and gradients that accumulate correctly when they are
kept (zero_grad(set_to_none=False), several backward passes)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fastenc import extension
from fastenc.layers.embedding import embedding


@pytest.fixture(autouse=True)
def _cache_on():
    extension.set_buffer_cache(True)  # loads the extension: buffer_empty serves the gradient from the cache
    yield


def _pair(rows=37, dim=29, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, dim, generator=g)
    return torch.nn.Parameter(w.clone()), torch.nn.Parameter(w.clone()), g


@pytest.mark.parametrize("padding_idx", [None, 3, -2])
@pytest.mark.parametrize("shape", [(53,), (4, 11), (0,)])
def test_matches_torch(padding_idx, shape):
    ours, ref, g = _pair()
    ids = torch.randint(0, 37, shape, generator=g)
    if ids.numel():
        ids.view(-1)[::5] = 3  # repeated ids and the padding row
        ids.view(-1)[1::7] = 35
    y, y_ref = embedding(ids, ours, padding_idx), F.embedding(ids, ref, padding_idx=padding_idx)
    assert torch.equal(y, y_ref)
    dy = torch.randn(y.shape, generator=g)
    (y * dy).sum().backward()
    (y_ref * dy).sum().backward()
    torch.testing.assert_close(ours.grad, ref.grad, rtol=1e-6, atol=1e-6)
    if padding_idx is not None:
        assert not ours.grad[padding_idx].any()


def test_block_reused_and_steps_correct():
    """Three steps with the gradient freed in between: each gradient is right (stale rows of the previous step are
    zeroed), and the later ones come from the cache (hits, no new misses)."""
    ours, ref, g = _pair(rows=6000, dim=48)  # 1.1 MB: above the cache's minimum size
    opt = torch.optim.SGD([ours], lr=0.1)
    opt_ref = torch.optim.SGD([ref], lr=0.1)
    for step in range(3):
        ids = torch.randint(0, 6000, (257,), generator=g)
        dy = torch.randn(257, 48, generator=g)
        before = extension.buffer_cache_stats()
        (embedding(ids, ours, 0) * dy).sum().backward()
        after = extension.buffer_cache_stats()
        (F.embedding(ids, ref, padding_idx=0) * dy).sum().backward()
        torch.testing.assert_close(ours.grad, ref.grad, rtol=1e-6, atol=1e-6)
        if step:
            assert after["hits"] > before["hits"] and after["misses"] == before["misses"]
        opt.step(), opt_ref.step()
        opt.zero_grad(set_to_none=True), opt_ref.zero_grad(set_to_none=True)
        assert torch.equal(ours.detach(), ref.detach())


def test_kept_gradient_accumulates():
    """set_to_none=False and two backward passes per step: autograd adds each new gradient into the kept one; the
    new one's block goes back to the cache and must not be the kept gradient's."""
    ours, ref, g = _pair(rows=5000, dim=40)
    for _ in range(2):
        for _ in range(2):
            ids = torch.randint(0, 5000, (131,), generator=g)
            dy = torch.randn(131, 40, generator=g)
            (embedding(ids, ours) * dy).sum().backward()
            (F.embedding(ids, ref) * dy).sum().backward()
        torch.testing.assert_close(ours.grad, ref.grad, rtol=1e-6, atol=1e-6)
        ours.grad.zero_(), ref.grad.zero_()


def test_frozen_weight_and_no_grad():
    w = torch.randn(9, 5)
    ids = torch.tensor([1, 8, 1])
    assert torch.equal(embedding(ids, w), F.embedding(ids, w))
    p = torch.nn.Parameter(w.clone())
    with torch.no_grad():
        y = embedding(ids, p)
    assert not y.requires_grad and torch.equal(y, w[ids])
    with pytest.raises(IndexError):
        embedding(torch.tensor([9]), p)
