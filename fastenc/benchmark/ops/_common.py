"""What every op benchmark spec shares: the case records (forward and backward), the inputs a spec's set-up
returns, the model dimensions and the fixed variable-length workload, and small input builders."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

HEADS, HEAD_DIM, HIDDEN = 12, 64, 768
VARLEN_N, VARLEN_MIN, VARLEN_MAX, VARLEN_SEED = 16, 16, 384, 0
SWEEP = (512, 1024, 2048, 4096)  # the long-sequence sweep, batch 1
COMPUTE, MEMORY = "compute", "memory"


def varlen_lengths(n: int = VARLEN_N, lo: int = VARLEN_MIN, hi: int = VARLEN_MAX, seed: int = VARLEN_SEED) -> list[int]:
    """The variable-length workload: n lengths uniform in [lo, hi], torch.Generator seeded with `seed`."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi + 1, (n,), generator=g).tolist()


def batch(b: int, s: int) -> list[int]:
    return [s] * b


BERT, VIT = batch(8, 128), batch(8, 197)  # the 8 x 128 text batch and the 8 x 197 ViT batch


@dataclass
class Case:
    """One forward benchmark point: an op at a shape that a real model (or the sweep) produces.

    lengths: sequence lengths of the batch (token ops see sum(lengths) rows); dims: op-specific sizes;
    quick: one of the cases `--quick` keeps."""

    op: str
    shape: str
    source: str
    lengths: list[int]
    dims: dict = field(default_factory=dict)
    quick: bool = False

    @property
    def tokens(self) -> int:
        return sum(self.lengths)


@dataclass
class OpInputs:
    """A spec's set-up of one forward case: `call(backend)` -> zero-argument fastenc call; `sel`: the inputs the
    registry's limits judge; baselines and peers by name; the reference call (fn, *args) the tolerance rule
    compares against; `canon`: provider -> its output in fastenc's layout; `liger`: a factory of liger-kernel's
    equivalent (None: liger has none at this case)."""

    call: Callable[[str], Callable[[], object]]
    sel: dict
    others: dict[str, Callable[[], object]]
    reference: tuple | None
    skipped: dict[str, str] = field(default_factory=dict)
    canon: dict[str, Callable[[object], torch.Tensor]] = field(default_factory=dict)
    liger: Callable[[], Callable[[], object]] | None = None


@dataclass
class BwdCase:
    """One forward + backward benchmark point (`fastenc bench kernels --backward`)."""

    op: str
    shape: str
    rows: int
    dims: dict = field(default_factory=dict)
    lengths: list[int] = field(default_factory=list)


@dataclass
class BwdInputs:
    """A spec's set-up of one backward case: fastenc's call, the same math in plain torch over `args`, the inputs
    that get gradients (fastenc's and the twins the baseline uses), the output gradients, the bytes or FLOPs."""

    fastenc: Callable[[], object]
    eager: Callable[..., object]
    args: tuple
    leaves: list[torch.Tensor]
    eager_leaves: list[torch.Tensor]
    grads: list[torch.Tensor]
    nbytes: int = 0
    flops: float = 0.0
    unpad: Callable[[torch.Tensor], torch.Tensor] | None = None  # padded (b, h, s, d) grad -> packed (t, h, d)


def rand(*shape, device, dtype, gen, scale=1.0):
    return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dtype)


def cu_seqlens(lengths: list[int], device) -> torch.Tensor:
    cu = [0]
    for L in lengths:
        cu.append(cu[-1] + L)
    return torch.tensor(cu, dtype=torch.int32, device=device)


def grad_inputs(device: str, dtype: torch.dtype):
    """(rnd, twin) of a backward set-up: rnd(*shape, scale, grad) draws from one generator seeded 0; twin copies
    leaves for the baseline (same values, own gradients)."""
    gen = torch.Generator(device="cpu").manual_seed(0)

    def rnd(*shape, scale=1.0, grad=False):
        t = (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dtype)
        return t.requires_grad_(grad)

    def twin(ts):
        return [t.detach().clone().requires_grad_(t.requires_grad) for t in ts]
    return rnd, twin


def backward_rows(quick: bool) -> int:
    return 64 if quick else 8 * 128


def backward_hidden(quick: bool) -> int:
    return 64 if quick else HIDDEN


def backward_heads(quick: bool) -> tuple[int, int]:
    return (2, 16) if quick else (HEADS, HEAD_DIM)
