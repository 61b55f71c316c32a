"""geglu samples: exact, tanh and quick forms, layouts, and out= (separate, or in place over the first half of x)."""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from fastenc import ops, testing
from fastenc.reference.geglu import geglu_ref
from op_samples._draw import HIDDEN, Data, is_small, lead_dims, lowp_or_none, out_mode

OP = "geglu"


def case(draw, backend):
    d = Data(draw, backend)
    dtype = d.dtype("geglu")
    lead, n = lead_dims(d, is_small(d)), draw(st.sampled_from(HIDDEN), label="N")
    approximate = draw(st.sampled_from(("none", "tanh", "quick")), label="approximate")
    x = d.randn(*lead, 2 * n, dtype=dtype, scale=2.0)
    xv = d.place(x, "x")
    out = out_mode(d, xv, (*lead, n), dtype, xv[..., :n] if xv.is_contiguous() else None)
    got = ops.geglu(xv, approximate, backend=backend, out=out)
    if out is not None:
        assert got is out, "geglu(out=...) must return out"
    ref = geglu_ref(x, approximate)
    lowp = lowp_or_none(dtype, lambda: geglu_ref(x, approximate, upcast=False))
    testing.assert_close(got, ref.float(), lowp, dtype=dtype, extra=d.extra(dtype, ref))


def opcheck_samples() -> dict[str, list[dict]]:
    """fastenc:: custom op -> opcheck samples keyed by its schema's argument names (no `backend`)."""
    r = testing.randn
    return {
        "geglu": [dict(x=r(5, 768), approximate="none"), dict(x=r(3, 2000, dtype=torch.float16), approximate="tanh"),
                  dict(x=r(3, 2002, dtype=torch.bfloat16), approximate="quick")],
        "geglu_out": [dict(x=r(5, 768), approximate="tanh", out=r(5, 384))],
        "geglu_bwd": [dict(grad=r(5, 384), x=r(5, 768), approximate="none"),
                      dict(grad=r(3, 1000, dtype=torch.float16), x=r(3, 2000, dtype=torch.float16), approximate="tanh"),
                      dict(grad=r(3, 1001), x=r(3, 2002), approximate="quick")],
    }


def opcheck_out_samples() -> list[tuple[str, str, dict]]:
    """The out= variant on each backend of the base op: (custom op, base op, sample)."""
    return [("geglu_out", "geglu", dict(x=testing.randn(5, 768), approximate="none", out=testing.randn(5, 384)))]
