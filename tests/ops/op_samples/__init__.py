"""Each op's test samples, one module per op, `OP` naming the registered op, and any of:
  case(draw, backend)           one Hypothesis example: run the op on `backend`, hold it to the fp32 reference
                                under the tolerance rule (tests/ops/test_properties.py);
  cu_seqlens_call(d, total, cu) (call, check) for an op taking cu_seqlens (test_properties_in_place.py);
  opcheck_samples()             fastenc:: custom op -> samples keyed by schema argument names (test_opcheck.py);
  opcheck_out_samples()         (out= custom op, base op, sample) (test_opcheck.py).
The generic tests iterate the modules found here, so a new op adds its own module and nothing else. Shared
drawing: _draw.py."""
from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType


def modules() -> dict[str, ModuleType]:
    """op -> its samples module, every one of this package (sorted by op)."""
    found: dict[str, ModuleType] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{__name__}.{info.name}")
        if mod.OP in found:
            raise ValueError(f"op_samples: {mod.OP!r} has two sample modules")
        found[mod.OP] = mod
    return found
