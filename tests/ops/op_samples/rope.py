"""rope samples: positions from cu_seqlens, position_ids (batched or packed, int32/int64) or the default
0..seq-1; q and k separate (drawn layouts) or views of one fused projection; and the cu_seqlens-in-place call."""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from fastenc import ops, testing
from fastenc.reference import rope_cache, rope_ref
from op_samples._draw import Data, cu_tensor, draw_split, positions_of

OP = "rope"


def rope_inputs(d: Data, dtype, tokens_lead):
    hq, hk = d.draw(st.integers(1, 3), label="heads_q"), d.draw(st.integers(1, 3), label="heads_k")
    dim = d.draw(st.sampled_from((2, 4, 8, 16, 32, 64, 80)), label="head_dim")
    half = d.draw(st.integers(1, dim // 2), label="rotary_dim/2")
    q = d.randn(*tokens_lead, hq, dim, dtype=dtype)
    k = d.randn(*tokens_lead, hk, dim, dtype=dtype)
    kind = d.draw(st.sampled_from(("separate", "fused")), label="q/k storage")
    if kind == "fused":  # q and k as views of one (..., hq + hk + 1, dim) projection output, NaN in the rest
        buf = torch.full((*tokens_lead, hq + hk + 1, dim), float("nan"), dtype=dtype, device=d.device)
        qv, kv = buf[..., :hq, :], buf[..., hq + 1:, :]
        qv.copy_(q)
        kv.copy_(k)
    else:
        qv, kv = d.place(q, "q", ("contiguous", "offset", "strided")), d.place(k, "k", ("contiguous", "offset"))
    return q, k, qv, kv, half


def rope_check(d: Data, dtype, q, k, qo, ko, cos, sin, pos):
    dim = q.shape[-1]
    q3, k3 = q.reshape(-1, q.shape[-2], dim), k.reshape(-1, k.shape[-2], dim)
    ref = rope_ref(q3, k3, cos, sin, pos)
    lowp = (None, None) if dtype == torch.float32 else rope_ref(q3, k3, cos, sin, pos, upcast=False)
    for name, o, r, lp in zip(("q", "k"), (qo, ko), ref, lowp):
        testing.assert_close(o.reshape(r.shape), r, lp, dtype=dtype, extra=d.extra(dtype, r), name=name)


def case(draw, backend):
    d = Data(draw, backend)
    dtype = d.dtype("rope")
    mode = draw(st.sampled_from(("cu_seqlens", "position_ids", "packed position_ids", "default")), label="positions")
    theta = draw(st.sampled_from((10000.0, 160000.0)), label="theta")
    if mode == "cu_seqlens":
        cu = draw_split(draw, draw(st.integers(0, 40), label="tokens"), "split")
        q, k, qv, kv, half = rope_inputs(d, dtype, (cu[-1],))
        pos = positions_of(cu, d.device)
        cos, sin = rope_cache(2 * half, max(cu[-1], 1) + draw(st.integers(0, 3), label="extra positions"), theta,
                              device=d.device)
        qo, ko = ops.rope(qv, kv, cos, sin, cu_seqlens=cu_tensor(cu, d.device), backend=backend)
    elif mode == "default":  # (batch, seq, heads, dim), positions 0..seq-1 in every row
        b, n = draw(st.integers(1, 3), label="batch"), draw(st.integers(1, 17), label="seq")
        q, k, qv, kv, half = rope_inputs(d, dtype, (b, n))
        cos, sin = rope_cache(2 * half, n + draw(st.integers(0, 3), label="extra positions"), theta, device=d.device)
        qo, ko = ops.rope(qv, kv, cos, sin, backend=backend)
        pos = torch.arange(n, device=d.device).repeat(b)
    else:
        lead = (draw(st.integers(1, 40), label="tokens"),) if mode.startswith("packed") else \
            (draw(st.integers(1, 3), label="batch"), draw(st.integers(1, 17), label="seq"))
        q, k, qv, kv, half = rope_inputs(d, dtype, lead)
        npos = draw(st.integers(1, 300), label="table positions")
        cos, sin = rope_cache(2 * half, npos, theta, device=d.device)
        pid = torch.randint(0, npos, lead, generator=d.gen).to(d.device)
        pid.view(-1)[0] = npos - 1  # the table's last row is reachable
        pid = pid.to(draw(st.sampled_from((torch.int32, torch.int64)), label="position_ids dtype"))
        qo, ko = ops.rope(qv, kv, cos, sin, position_ids=pid, backend=backend)
        pos = pid.reshape(-1).long()
    assert torch.equal(qv, q) and torch.equal(kv, k), "rope wrote into its inputs"
    assert qo.shape == q.shape and ko.shape == k.shape and qo.dtype == ko.dtype == dtype
    rope_check(d, dtype, q, k, qo, ko, cos, sin, pos)


def cu_seqlens_call(d: Data, total: int, cu: torch.Tensor):
    """(call, check) for the cu_seqlens-changed-in-place tests: call() runs rope on fixed random inputs with `cu`;
    check(out, split) holds it to the reference on `split`."""
    dtype = torch.float16 if d.backend == "cuda" else torch.float32
    q, k, qv, kv, half = rope_inputs(d, dtype, (total,))
    cos, sin = rope_cache(2 * half, total + 64, 10000.0, device=d.device)  # a table longer than any sequence
    call = lambda: ops.rope(qv, kv, cos, sin, cu_seqlens=cu, backend=d.backend)  # noqa: E731
    check = lambda out, split: rope_check(d, dtype, q, k, *out, cos, sin, positions_of(split, d.device))  # noqa: E731
    return call, check


def opcheck_samples() -> dict[str, list[dict]]:
    """fastenc:: custom op -> opcheck samples keyed by its schema's argument names (no `backend`)."""
    r = testing.randn
    cos, sin = rope_cache(64, 32, 160000.0)
    return {
        "rope": [
            dict(q=r(7, 3, 64), k=r(7, 1, 64), cos=cos, sin=sin, positions=torch.arange(7, dtype=torch.int32)),
            dict(q=r(5, 2, 80, dtype=torch.bfloat16), k=r(5, 2, 80, dtype=torch.bfloat16), cos=cos[:, :16],
                 sin=sin[:, :16], positions=torch.tensor([4, 0, 31, 2, 2], dtype=torch.int32)),
        ],
        "rope_bwd": [dict(grad_q=r(7, 3, 64), grad_k=r(7, 1, 64), cos=cos, sin=sin,
                          positions=torch.arange(7, dtype=torch.int32))],
    }
