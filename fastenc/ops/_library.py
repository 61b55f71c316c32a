"""Registration of the `fastenc::<op>` operators with torch.library.

`custom_op(name, mutates_args=...)` is a drop-in for `torch.library.custom_op` for our use: the schema is inferred
from the function's type hints the same way (torch.library.infer_schema), the function becomes the op's CPU and
CUDA kernel, and `.register_fake` adds the fake (meta) kernel that tracing and torch.compile use. What differs is
the cost of a call: torch.library.custom_op runs its kernels through Python wrappers (an autograd wrapper, a
dynamo-disable frame, an output-aliasing check) that cost ~10-20 us per call; here the dispatcher calls the
function directly (~3 us over a plain Python call). At batch 1 or short sequences, and on a GPU, that per-op cost
is a visible share of a layer.

Autograd: every functional op gets an autograd kernel at definition; its formula is attached later with
`Op.register_autograd(backward, setup_context)` (the op file defines the backward op first). Until then, and for
the `<op>_bwd` ops themselves (no second-order gradients), a backward pass that reaches the op raises
RuntimeError naming it. That autograd kernel is skipped under torch.inference_mode(), where inference runs.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

_LIB = torch.library.Library("fastenc", "DEF")  # defining schemas is cheap: no compilation, no device probe
_KEYS = ("CPU", "CUDA")


def _no_backward_message(qualname: str) -> str:
    if qualname.endswith("_bwd"):
        return (f"{qualname} has no backward: second-order gradients through {qualname[:-4]} are not supported "
                "(use create_graph=False)")
    return f"{qualname} has no backward (run it under torch.inference_mode() or torch.no_grad())"


class Op:
    """A defined `fastenc::<name>` op: call it like the function it was made from."""

    def __init__(self, qualname: str, fn: Callable, mutates_args: Sequence[str]):
        ns, _, name = qualname.partition("::")
        if ns != "fastenc" or not name:
            raise ValueError(f"custom_op: name must be 'fastenc::<op>', got {qualname!r}")
        _LIB.define(name + torch.library.infer_schema(fn, mutates_args=tuple(mutates_args)))
        for key in _KEYS:
            _LIB.impl(name, fn, key)
        self._backward: Callable | None = None
        self._setup_context: Callable | None = None
        if not mutates_args:  # (an op writing into `out` returns nothing to differentiate)
            torch.library.register_autograd(qualname, self._autograd_backward, setup_context=self._autograd_setup,
                                            lib=_LIB)
        self.qualname = qualname
        self.fn = fn
        self._overload = getattr(torch.ops.fastenc, name).default
        self.__name__ = getattr(fn, "__name__", name)
        self.__doc__ = fn.__doc__

    def __call__(self, *args):
        return self._overload(*args)

    def register_autograd(self, backward: Callable, setup_context: Callable) -> None:
        """Attach the op's derivative: setup_context(ctx, inputs, output) saves what backward(ctx, *grads) needs;
        backward returns one gradient (or None) per op argument."""
        self._backward, self._setup_context = backward, setup_context

    def _autograd_setup(self, ctx, inputs, output) -> None:
        if self._setup_context is not None:
            self._setup_context(ctx, inputs, output)

    def _autograd_backward(self, ctx, *grads):
        if self._backward is None:
            raise RuntimeError(_no_backward_message(self.qualname))
        return self._backward(ctx, *grads)

    def register_fake(self, fake: Callable) -> Callable:
        torch.library.register_fake(self.qualname, fake, lib=_LIB)
        return fake


def custom_op(qualname: str, mutates_args: Sequence[str] = ()) -> Callable[[Callable], Op]:
    def define(fn: Callable) -> Op:
        return Op(qualname, fn, mutates_args)
    return define
