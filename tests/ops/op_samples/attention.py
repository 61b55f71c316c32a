"""attention samples: padded, key-padding-masked (empty rows and left padding included) and varlen (empty
sequences included) layouts, windows, scales, head dims each backend takes, q/k/v separate or fused; and the
cu_seqlens-in-place call."""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from fastenc import ops, testing
from fastenc.reference.attention import attention_ref, attention_varlen_ref
from fastenc.reference.attention_relative import slot_lookup
from op_samples._draw import Data, cu_of_lengths, cu_tensor, draw_split, is_small, lowp_or_none

INTERPRETER_DTYPES = (torch.float32, torch.float16)  # its Triton kernel uses tl.dot

OP = "attention"


def head_dims(backend):
    if backend == "triton":
        return (8, 16, 32, 64)
    if backend == "cuda":
        return (32, 64, 96, 128)
    return (1, 3, 8, 20, 64)


def _window(draw):
    kind = draw(st.sampled_from(("none", "int", "pair")), label="window kind")
    if kind == "none":
        return None, (-1, -1)
    if kind == "int":
        w = draw(st.integers(0, 6), label="window")
        return w, (w, w)
    w = (draw(st.integers(0, 6), label="window left"), draw(st.integers(0, 6), label="window right"))
    return w, w


def qkv(d: Data, dtype, lead, heads, dim):
    """q, k, v of shape (*lead, heads, dim) and views of them: separate (drawn layouts) or one fused projection."""
    q, k, v = (d.randn(*lead, heads, dim, dtype=dtype) for _ in range(3))
    if d.draw(st.sampled_from(("separate", "fused")), label="qkv storage") == "fused":
        buf = torch.full((*lead, 3, heads, dim), float("nan"), dtype=dtype, device=d.device)
        views = buf.unbind(-3)
        for view, t in zip(views, (q, k, v)):
            view.copy_(t)
        return (q, k, v), views
    return (q, k, v), tuple(d.place(t, n, ("contiguous", "offset", "strided")) for t, n in zip((q, k, v), "qkv"))


def case(draw, backend):
    d = Data(draw, backend)
    dtype = d.dtype(OP, INTERPRETER_DTYPES)
    heads, dim = draw(st.integers(1, 2), label="heads"), draw(st.sampled_from(head_dims(backend)), label="head_dim")
    window, w = _window(draw)
    scale = draw(st.one_of(st.none(), st.floats(0.05, 1.0)), label="scale")
    layout = draw(st.sampled_from(("padded", "masked", "varlen")), label="layout")
    maxlen = 24 if is_small(d) else 70
    if layout == "varlen":
        cu = draw_split(draw, draw(st.integers(0, maxlen), label="tokens"), "split")
        (q, k, v), (qv, kv, vv) = qkv(d, dtype, (cu[-1],), heads, dim)
        longest = max(b - a for a, b in zip(cu, cu[1:]))
        max_seqlen = draw(st.one_of(st.none(), st.integers(longest, longest + 3)), label="max_seqlen")
        cut = cu_tensor(cu, d.device)
        out = ops.attention(qv, kv, vv, cu_seqlens=cut, max_seqlen=max_seqlen, window=window, scale=scale,
                            backend=backend)
        ref_fn = lambda up: attention_varlen_ref(q, k, v, cut, w, scale, upcast=up)  # noqa: E731
    else:
        b, s = draw(st.integers(1, 3), label="batch"), draw(st.integers(1, maxlen // 2), label="seq")
        (q, k, v), (qv, kv, vv) = qkv(d, dtype, (b, s), heads, dim)
        mask = None
        if layout == "masked":  # one run of real tokens per row [start, end), empty rows and left padding included
            mask = torch.zeros(b, s, dtype=torch.bool)
            for row in range(b):
                start = draw(st.integers(0, s), label="real start")
                mask[row, start:draw(st.integers(start, s), label="real end")] = True
            mask = mask.to(d.device)
        out = ops.attention(qv, kv, vv, key_padding_mask=mask, window=window, scale=scale, backend=backend)
        ref_fn = lambda up: attention_ref(q, k, v, mask, w, scale, upcast=up)  # noqa: E731
        if mask is not None:
            assert torch.equal(out[~mask], torch.zeros_like(out[~mask])), "padded query rows must be zero"
    assert out.shape == q.shape and out.dtype == dtype
    ref32 = ref_fn(True)
    testing.assert_close(out, ref32.float(), lowp_or_none(dtype, lambda: ref_fn(False)), dtype=dtype,
                         extra=d.extra(dtype, ref32))


def cu_seqlens_call(d: Data, total: int, cu: torch.Tensor):
    """(call, check) for the cu_seqlens-changed-in-place tests: call() runs attention on fixed random inputs with
    `cu`; check(out, split) holds it to the reference on `split`."""
    dtype = torch.float16 if d.backend == "cuda" else torch.float32
    dim = 16 if d.backend == "triton" else head_dims(d.backend)[-1]
    (q, k, v), (qv, kv, vv) = qkv(d, dtype, (total,), 2, dim)
    call = lambda: ops.attention(qv, kv, vv, cu_seqlens=cu, backend=d.backend)  # noqa: E731
    ref = lambda split, up: attention_varlen_ref(q, k, v, cu_tensor(split, d.device), upcast=up)  # noqa: E731
    check = lambda out, split: testing.assert_close(  # noqa: E731
        out, ref(split, True).float(), lowp_or_none(dtype, lambda: ref(split, False)), dtype=dtype)
    return call, check


def opcheck_samples() -> dict[str, list[dict]]:
    """fastenc:: custom op -> opcheck samples keyed by its schema's argument names (no `backend`)."""
    r = testing.randn
    return {
        "attention": [
            dict(q=r(9, 2, 64), k=r(9, 2, 64), v=r(9, 2, 64), cu_seqlens=cu_of_lengths(4, 5), max_seqlen=5,
                 window_left=-1, window_right=-1, scale=0.125, dropout_p=0.0, seed=0, offset=0, bias=None,
                 positions=None, c2p=None, p2c=None, slot=None),
            dict(q=r(7, 3, 32, dtype=torch.bfloat16), k=r(7, 3, 32, dtype=torch.bfloat16),
                 v=r(7, 3, 32, dtype=torch.bfloat16), cu_seqlens=cu_of_lengths(7), max_seqlen=7, window_left=2,
                 window_right=1, scale=32 ** -0.5, dropout_p=0.2, seed=5, offset=7, bias=None,
                 positions=None, c2p=None, p2c=None, slot=None),
            # a distance bias lookup (heads, 2 * 5 - 1), as relative_bias / alibi_slopes become
            dict(q=r(9, 2, 64), k=r(9, 2, 64), v=r(9, 2, 64), cu_seqlens=cu_of_lengths(4, 5), max_seqlen=5,
                 window_left=-1, window_right=2, scale=0.125, dropout_p=0.0, seed=0, offset=0, bias=r(2, 9),
                 positions=None, c2p=None, p2c=None, slot=None),
            # per-token positions (lookups for L = 6) with DeBERTa's c2p / p2c (rel_span 2: 4 slots) and a bias
            dict(q=r(9, 2, 16), k=r(9, 2, 16), v=r(9, 2, 16), cu_seqlens=cu_of_lengths(4, 5), max_seqlen=5,
                 window_left=-1, window_right=-1, scale=0.25, dropout_p=0.0, seed=0, offset=0, bias=r(2, 11),
                 positions=torch.tensor([0, 2, 5, 1, 3, 3, 0, 4, 1], dtype=torch.int32), c2p=r(9, 2, 4),
                 p2c=r(9, 2, 4), slot=slot_lookup(6, 2)),
            # c2p only, index positions
            dict(q=r(9, 2, 16), k=r(9, 2, 16), v=r(9, 2, 16), cu_seqlens=cu_of_lengths(4, 5), max_seqlen=5,
                 window_left=1, window_right=-1, scale=0.25, dropout_p=0.0, seed=0, offset=0, bias=None,
                 positions=None, c2p=r(9, 2, 6), p2c=None, slot=slot_lookup(5, 3)),
        ],
        "attention_bwd": [
            dict(grad=r(9, 2, 64), q=r(9, 2, 64), k=r(9, 2, 64), v=r(9, 2, 64), out=r(9, 2, 64),
                 lse=r(2, 9).abs() + 3.0, cu_seqlens=cu_of_lengths(4, 0, 5), max_seqlen=5, window_left=-1,
                 window_right=-1, scale=0.125, dropout_p=0.0, seed=0, offset=0, need_dq=True, need_dkdv=True),
            dict(grad=r(7, 3, 32, dtype=torch.bfloat16), q=r(7, 3, 32, dtype=torch.bfloat16),
                 k=r(7, 3, 32, dtype=torch.bfloat16), v=r(7, 3, 32, dtype=torch.bfloat16),
                 out=r(7, 3, 32, dtype=torch.bfloat16), lse=r(3, 7).abs() + 3.0, cu_seqlens=cu_of_lengths(7),
                 max_seqlen=7, window_left=2, window_right=1, scale=32 ** -0.5, dropout_p=0.2, seed=5, offset=7,
                 need_dq=False, need_dkdv=True),
        ],
    }
