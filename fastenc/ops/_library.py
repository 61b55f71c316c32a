"""Registration of the `fastenc::<op>` operators with torch.library.

`custom_op(name, mutates_args=...)` is a drop-in for `torch.library.custom_op` for our use: the schema is inferred
from the function's type hints the same way (torch.library.infer_schema), the function becomes the op's CPU and
CUDA kernel, and `.register_fake` adds the fake (meta) kernel that tracing and torch.compile use. What differs is
the cost of a call: torch.library.custom_op runs its kernels through Python wrappers (an autograd wrapper, a
dynamo-disable frame, an output-aliasing check) that cost ~10-20 us per call; here the dispatcher calls the
function directly (~3 us over a plain Python call). At batch 1 or short sequences, and on a GPU, that per-op cost
is a visible share of a layer.

The kernels are inference kernels: a backward pass that reaches one raises RuntimeError naming the op (as
torch.library.custom_op does without a registered formula). That autograd kernel is skipped under
torch.inference_mode(), where the models run.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

_LIB = torch.library.Library("fastenc", "DEF")  # defining schemas is cheap: no compilation, no device probe
_KEYS = ("CPU", "CUDA")


def _no_backward(qualname: str) -> Callable:
    def backward(ctx, *grads):
        raise RuntimeError(f"{qualname} has no backward: fastenc's kernels are inference kernels (run the model "
                           "under torch.inference_mode() or torch.no_grad())")
    return backward


def _no_context(ctx, inputs, output) -> None:
    return None


class Op:
    """A defined `fastenc::<name>` op: call it like the function it was made from."""

    def __init__(self, qualname: str, fn: Callable, mutates_args: Sequence[str]):
        ns, _, name = qualname.partition("::")
        if ns != "fastenc" or not name:
            raise ValueError(f"custom_op: name must be 'fastenc::<op>', got {qualname!r}")
        _LIB.define(name + torch.library.infer_schema(fn, mutates_args=tuple(mutates_args)))
        for key in _KEYS:
            _LIB.impl(name, fn, key)
        if not mutates_args:  # (an op writing into `out` returns nothing to differentiate)
            torch.library.register_autograd(qualname, _no_backward(qualname), setup_context=_no_context, lib=_LIB)
        self.qualname = qualname
        self.fn = fn
        self._overload = getattr(torch.ops.fastenc, name).default
        self.__name__ = getattr(fn, "__name__", name)
        self.__doc__ = fn.__doc__

    def __call__(self, *args):
        return self._overload(*args)

    def register_fake(self, fake: Callable) -> Callable:
        torch.library.register_fake(self.qualname, fake, lib=_LIB)
        return fake


def custom_op(qualname: str, mutates_args: Sequence[str] = ()) -> Callable[[Callable], Op]:
    def define(fn: Callable) -> Op:
        return Op(qualname, fn, mutates_args)
    return define
