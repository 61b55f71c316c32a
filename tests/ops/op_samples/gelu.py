"""gelu samples: exact, tanh and quick forms, bias, layouts, and out= (separate, or in place over x)."""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from fastenc import ops, testing
from fastenc.reference.gelu import gelu_ref
from op_samples._draw import HIDDEN, Data, is_small, lead_dims, lowp_or_none, out_mode

OP = "gelu"


def case(draw, backend):
    d = Data(draw, backend)
    dtype = d.dtype("gelu")
    lead, n = lead_dims(d, is_small(d)), draw(st.sampled_from(HIDDEN), label="N")
    approximate = draw(st.sampled_from(("none", "tanh", "quick")), label="approximate")
    x = d.randn(*lead, n, dtype=dtype, scale=3.0)
    bias = d.randn(n, dtype=dtype) if draw(st.booleans(), label="bias") else None
    xv = d.place(x, "x")
    out = out_mode(d, xv, x.shape, dtype, xv if xv.is_contiguous() else None)
    got = ops.gelu(xv, bias, approximate, backend=backend, out=out)
    if out is not None:
        assert got is out, "gelu(out=...) must return out"
    ref = gelu_ref(x, bias, approximate)
    lowp = lowp_or_none(dtype, lambda: gelu_ref(x, bias, approximate, upcast=False))
    testing.assert_close(got, ref.float(), lowp, dtype=dtype, extra=d.extra(dtype, ref))


def opcheck_samples() -> dict[str, list[dict]]:
    """fastenc:: custom op -> opcheck samples keyed by its schema's argument names (no `backend`)."""
    r = testing.randn
    return {
        "gelu": [
            dict(x=r(5, 384), bias=r(384), approximate="none"),
            dict(x=r(3, 1000, dtype=torch.bfloat16), bias=None, approximate="tanh"),
            dict(x=r(3, 1001), bias=r(1001), approximate="quick"),
        ],
        "gelu_out": [dict(x=r(5, 384), bias=r(384), approximate="none", out=r(5, 384))],
        "gelu_bwd": [
            dict(grad=r(5, 384), x=r(5, 384), bias=r(384), approximate="none", need_dx=True, need_dbias=True),
            dict(grad=r(3, 1000, dtype=torch.bfloat16), x=r(3, 1000, dtype=torch.bfloat16), bias=None,
                 approximate="tanh", need_dx=True, need_dbias=False),
            dict(grad=r(5, 384), x=r(5, 384), bias=r(384), approximate="tanh", need_dx=False, need_dbias=True),
            dict(grad=r(3, 1001), x=r(3, 1001), bias=r(1001), approximate="quick", need_dx=True, need_dbias=True),
        ],
    }


def opcheck_out_samples() -> list[tuple[str, str, dict]]:
    """The out= variant on each backend of the base op: (custom op, base op, sample)."""
    r = testing.randn
    return [
        ("gelu_out", "gelu", dict(x=r(5, 384), bias=r(384), approximate="none", out=r(5, 384))),
        ("gelu_out", "gelu", dict(x=r(3, 1000, dtype=torch.bfloat16), bias=None, approximate="tanh",
                                  out=r(3, 1000, dtype=torch.bfloat16))),
    ]
