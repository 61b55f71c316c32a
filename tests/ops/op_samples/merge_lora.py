"""merge_lora samples: drawn weight and adapter sizes, ranks, an adapter dtype other than the weight's, scale,
in place or not, layouts."""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from fastenc import ops, testing
from fastenc.reference.merge_lora import merge_lora_ref
from op_samples._draw import Data, draw_features, draw_rank, lowp_or_none

INTERPRETER_DTYPES = (torch.float32, torch.float16)  # its Triton kernel uses tl.dot

OP = "merge_lora"


def case(draw, backend):
    d = Data(draw, backend)
    dtype = d.dtype(OP, INTERPRETER_DTYPES)
    out_f, in_f, r = draw_features(d, "out_features"), draw_features(d, "in_features"), draw_rank(d)
    adapter_dtype = d.dtype(OP, INTERPRETER_DTYPES) if draw(st.booleans(), label="adapter dtype differs") else dtype
    w = d.randn(out_f, in_f, dtype=dtype)
    a, b = d.randn(r, in_f, dtype=adapter_dtype), d.randn(out_f, r, dtype=adapter_dtype)
    scale = draw(st.floats(-2.0, 2.0, allow_nan=False), label="scale")
    inplace = draw(st.booleans(), label="inplace")
    wv, av, bv = d.place(w, "weight"), d.place(a, "lora_a"), d.place(b, "lora_b")
    got = ops.merge_lora(wv, av, bv, scale, backend=backend, inplace=inplace)
    if inplace:
        assert got is wv, "merge_lora(inplace=True) must return the weight it wrote"
    else:
        assert torch.equal(wv, w), "merge_lora(inplace=False) wrote into weight"
    ref = merge_lora_ref(w, a, b, scale)
    lowp = lowp_or_none(dtype, lambda: merge_lora_ref(w, a, b, scale, upcast=False))
    testing.assert_close(got, ref.float(), lowp, dtype=dtype, extra=d.extra(dtype, ref))


def opcheck_samples() -> dict[str, list[dict]]:
    """fastenc:: custom op -> opcheck samples keyed by its schema's argument names (no `backend`)."""
    r = testing.randn
    return {"merge_lora": [dict(weight=r(48, 40), lora_a=r(8, 40), lora_b=r(48, 8), scale=2.0)]}
