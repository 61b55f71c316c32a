"""swiglu samples: the fused (..., 2N) input [gate | up] and the two-input form, in drawn layouts."""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from fastenc import ops, testing
from fastenc.reference.swiglu import swiglu_ref
from op_samples._draw import HIDDEN, Data, is_small, lead_dims, lowp_or_none

OP = "swiglu"


def case(draw, backend):
    d = Data(draw, backend)
    dtype = d.dtype(OP)
    lead, n = lead_dims(d, is_small(d)), draw(st.sampled_from(HIDDEN), label="N")
    if draw(st.booleans(), label="two inputs"):
        gate, up = d.randn(*lead, n, dtype=dtype, scale=3.0), d.randn(*lead, n, dtype=dtype, scale=2.0)
        got = ops.swiglu(d.place(gate, "gate"), up=d.place(up, "up"), backend=backend)
    else:
        gate, up = None, None
        x = d.randn(*lead, 2 * n, dtype=dtype, scale=3.0)
        got = ops.swiglu(d.place(x, "x"), backend=backend)
        gate, up = x[..., :n], x[..., n:]
    ref = swiglu_ref(gate, up)
    lowp = lowp_or_none(dtype, lambda: swiglu_ref(gate, up, upcast=False))
    testing.assert_close(got, ref.float(), lowp, dtype=dtype, extra=d.extra(dtype, ref))


def opcheck_samples() -> dict[str, list[dict]]:
    """fastenc:: custom op -> opcheck samples keyed by its schema's argument names (no `backend`)."""
    r = testing.randn
    h = torch.float16
    return {
        "swiglu": [dict(x=r(5, 768), up=None), dict(x=r(3, 1001, dtype=h), up=r(3, 1001, dtype=h))],
        "swiglu_bwd": [dict(grad=r(5, 384), x=r(5, 768), up=None),
                       dict(grad=r(3, 1001, dtype=h), x=r(3, 1001, dtype=h), up=r(3, 1001, dtype=h))],
    }
