"""One builder for every backend's implementation of an op: `implement(op, backend, target...)` takes the devices,
default priority, availability, probe and check from the backend's declaration (fastenc.backends) and the
function from the backend's `resolve(target...)`, so an op module only names its functions and a new backend
needs no builder of its own."""
from __future__ import annotations

from typing import Any, Callable, Mapping

from fastenc import backends, registry
from fastenc.backends import lazy
from fastenc.registry import FLOAT_DTYPES, Impl

__all__ = ["implement", "lazy"]


def implement(op: str, backend: str, *target: Any, check: Callable[[Mapping[str, Any]], list[str]] | None = None,
              dtypes=FLOAT_DTYPES, priority: int | None = None, limits: str = "", wrap: Callable | None = None,
              probe: Callable[[], str | None] | None = None) -> Impl:
    """Register `backend`'s implementation of `op`: the function its declaration resolves `target` to (wrapped by
    `wrap` when given), the backend's check before the op's own `check`, its default priority and limits unless
    given. Returns the registered Impl."""
    b = backends.get(backend)
    fn = b.resolve(*target)
    if b.check is None:
        full_check = check
    elif check is None:
        full_check = b.check
    else:
        def full_check(inputs, own=b.check, extra=check):
            return own(inputs) + extra(inputs)
    return registry.register(Impl(op=op, backend=backend, fn=wrap(fn) if wrap else fn, devices=b.devices,
                                  auto_devices=b.auto_devices, dtypes=dtypes,
                                  priority=b.priority if priority is None else priority, available=b.available,
                                  check=full_check, limits=limits or b.limits, probe=probe or b.probe))
