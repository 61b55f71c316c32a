"""SelfAttention.attend_rows(x, ..., rows) = attend(x, ...)[rows] in value and gradient: queries projected at the
rows only, keys and values at every token; windows, RoPE, repeated rows and empty sequences."""
import pytest
import torch

from fastenc import ops
from fastenc.layers import SelfAttention
from fastenc.padding import gather_rows


def _case(lens, window, seed):
    g = torch.Generator().manual_seed(seed)
    attn = SelfAttention(40, 5, window=window)
    with torch.no_grad():
        for p in attn.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    x = torch.randn(int(cu[-1]), 40, generator=g)
    return attn, cu, x, g


def _rope(cu, lens):
    cos, sin = ops.rope_cache(8, 64)  # head_dim 40 / 5
    pos = torch.cat([torch.arange(n, dtype=torch.int32) for n in lens])
    return cos, sin, pos


@pytest.mark.parametrize("window", [None, (3, 2), (0, 5)], ids=["global", "window-3-2", "window-0-5"])
@pytest.mark.parametrize("rope", [False, True], ids=["plain", "rope"])
def test_rows_equal_the_full_attention(window, rope):
    lens = [7, 1, 0, 19, 4]
    attn, cu, x, g = _case(lens, window, 3)
    r = _rope(cu, lens) if rope else None
    rows = torch.tensor([0, 7, 8, 8, 12, 26, 29, 30])  # first rows, inner rows, a repeat, the last token
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    got = attn.attend_rows(xa, cu, max(lens), rows, rope=r)
    attn_b = SelfAttention(40, 5, window=window)
    attn_b.load_state_dict(attn.state_dict())
    want = gather_rows(attn_b.attend(xb, cu, max(lens), rope=r), rows)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    dy = torch.randn(got.shape, generator=g)
    (got * dy).sum().backward()
    (want * dy).sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-4, atol=1e-5)
    for (name, p), q in zip(attn.named_parameters(), attn_b.parameters()):
        # a weight's gradient sums over every token: fp32 rounding grows with its largest entry
        scale = 1.0 if q.grad is None else max(1.0, float(q.grad.abs().max()))
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5 * scale, msg=name)


def test_first_rows_with_empty_sequences():
    """PackedBatch.first_rows() gives an empty sequence some valid row (the next sequence's first, or the last
    token): the result there is that row's, finite, as attend()[rows] gives."""
    lens = [5, 0, 3, 0]
    attn, cu, x, _ = _case(lens, (2, 1), 5)
    rows = cu[:-1].long().clamp(max=int(cu[-1]) - 1)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    got = attn.attend_rows(xa, cu, 5, rows)
    want = gather_rows(attn.attend(xb, cu, 5), rows)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    got.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-4, atol=1e-5)


def test_projects_queries_at_the_rows_only():
    lens = [9, 14]
    attn, cu, x, _ = _case(lens, None, 7)
    seen = []
    real = torch.nn.functional.linear

    def spy(inp, w, b=None):
        seen.append((inp.shape[0], w.shape[0]))
        return real(inp, w, b)

    from fastenc.layers import attention as mod
    old = mod.F.linear
    mod.F.linear = spy
    try:
        attn.attend_rows(x.requires_grad_(), cu, 14, torch.tensor([0, 9]))
    finally:
        mod.F.linear = old
    assert sorted(seen) == [(2, 40), (23, 80)]  # q: 2 rows x hidden; k, v: every token x 2 * hidden


def test_no_rows():
    attn, cu, x, _ = _case([4, 6], None, 9)
    out = attn.attend_rows(x, cu, 6, torch.empty(0, dtype=torch.long))
    assert out.shape == (0, 40)


def test_training_with_attention_dropout_runs_the_kernels_dropout():
    # dropout belongs to the attention kernels (the mask regenerated in their backward): with it on in training the
    # rows come from attend() with the same seed, values and gradients alike
    attn, cu, x, _ = _case([5, 9, 3], None, 11)
    attn.dropout = 0.3
    attn.train()
    rows = cu[:-1].long()
    outs, grads = [], []
    for run in (lambda xx: attn.attend_rows(xx, cu, 9, rows), lambda xx: gather_rows(attn.attend(xx, cu, 9), rows)):
        xx = x.clone().requires_grad_(True)
        torch.manual_seed(5)
        out = run(xx)
        out.square().sum().backward()
        outs.append(out.detach())
        grads.append(xx.grad)
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)
    attn.eval()  # eval: no dropout, the rows' own path, equal to the full attention to rounding
    torch.testing.assert_close(attn.attend_rows(x, cu, 9, rows), gather_rows(attn.attend(x, cu, 9), rows),
                               rtol=1e-5, atol=1e-6)
