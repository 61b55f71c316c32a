"""sparse_max samples: drawn splits of the tokens (empty sequences included), hidden and vocabulary sizes (odd, 1
included), bias or none, dtypes and layouts of x and weight; held to the fp32 reference under the tolerance rule."""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from fastenc import ops, testing
from fastenc.reference.sparse_max import sparse_max_ref
from op_samples._draw import INTERP, Data, cu_tensor, draw_split, lowp_or_none

OP = "sparse_max"


def _sizes(d: Data) -> tuple[int, int, int]:
    small = d.backend == "triton" and INTERP
    total = d.draw(st.integers(0, 40 if small else 200), label="tokens")
    h = d.draw(st.sampled_from((1, 7, 36, 64) if small else (1, 7, 36, 64, 383, 768)), label="hidden")
    v = d.draw(st.sampled_from((1, 33, 97) if small else (1, 33, 97, 1237)), label="vocab")
    return total, h, v


def case(draw, backend):
    d = Data(draw, backend)
    dtype = d.dtype(OP)
    total, h, v = _sizes(d)
    cu = cu_tensor(draw_split(draw, total, "split"), d.device)
    x = d.randn(total, h, dtype=dtype)
    w = d.randn(v, h, dtype=dtype, scale=h ** -0.5)
    b = d.randn(v, dtype=dtype, scale=0.5) if draw(st.booleans(), label="bias") else None
    got = ops.sparse_max(d.place(x, "x"), cu, d.place(w, "weight"), b, backend=backend)
    lowp = lowp_or_none(dtype, lambda: sparse_max_ref(x, cu, w, b, upcast=False))
    testing.assert_close(got, sparse_max_ref(x, cu, w, b), lowp, dtype=dtype)


def cu_seqlens_call(d: Data, total: int, cu: torch.Tensor):
    """(call, check) for the cu_seqlens-changed-in-place tests: fixed random x and weight, the split from `cu`."""
    x, w, b = d.randn(total, 36), d.randn(97, 36, scale=36 ** -0.5), d.randn(97, scale=0.5)
    call = lambda: ops.sparse_max(x, cu, w, b, backend=d.backend)  # noqa: E731
    check = lambda out, split: testing.assert_close(  # noqa: E731
        out, sparse_max_ref(x, cu_tensor(split, d.device), w, b), dtype=torch.float32)
    return call, check


def opcheck_samples() -> dict[str, list[dict]]:
    """fastenc:: custom op -> opcheck samples keyed by its schema's argument names (no `backend`)."""
    r = testing.randn
    cu = torch.tensor([0, 3, 3, 10], dtype=torch.int32)
    return {"sparse_max": [
        dict(x=r(10, 36), cu_seqlens=cu, weight=r(97, 36), bias=r(97)),
        dict(x=r(10, 16, dtype=torch.bfloat16), cu_seqlens=cu, weight=r(33, 16, dtype=torch.bfloat16), bias=None),
    ]}
