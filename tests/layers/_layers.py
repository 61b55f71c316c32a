"""Shared set-up of the Linear-layer tests: a Linear with random weights at the usual 1/sqrt(in) scale."""
from __future__ import annotations

import torch

from fastenc import testing
from fastenc.layers import Linear


def random_linear(k: int, n: int, bias: bool = True) -> Linear:
    lin = Linear(k, n, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(testing.randn(n, k, scale=k ** -0.5))
        if bias:
            lin.bias.copy_(testing.randn(n))
    return lin
