"""dropout samples: opcheck only (its values are random by design; tests/ops/test_dropout.py checks the mask's
statistics and that every backend draws the same one)."""
from __future__ import annotations

from fastenc import testing

OP = "dropout"


def opcheck_samples() -> dict[str, list[dict]]:
    """fastenc:: custom op -> opcheck samples keyed by its schema's argument names (no `backend`)."""
    r = testing.randn
    return {
        "dropout": [dict(x=r(5, 384), bias=r(384), dropout_p=0.1, seed=3, offset=9),
                    dict(x=r(3, 1000), bias=None, dropout_p=0.5, seed=-4, offset=0)],
        "dropout_bwd": [dict(grad=r(5, 384), dropout_p=0.1, seed=3, offset=9)],
    }
