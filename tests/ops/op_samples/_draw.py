"""What every op's samples draw with: `run` (derandomized, bounded Hypothesis examples), `Data` (one example's
tensors from one drawn seed, in drawn memory layouts), leading dims, hidden sizes, out= modes and varlen splits."""
from __future__ import annotations

import itertools

import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from fastenc import registry, testing

INTERP = registry.interpreter_on() and not torch.cuda.is_available()
EXAMPLES = {"triton": 5 if INTERP else 12}  # examples per backend (default 12): fewer under the interpreter
HIDDEN = (1, 2, 7, 64, 383, 384, 1000, 1001, 1152)
LAYOUTS = ("contiguous", "offset", "strided", "transposed")


def run(backend: str, case, examples: int | None = None) -> None:
    """Run `case(draw, backend)` over derandomized Hypothesis examples (no shrinking: bounded time; the falsifying
    example's draws are printed as found)."""

    @settings(max_examples=examples or EXAMPLES.get(backend, 12), deadline=None, derandomize=True, database=None,
              phases=(Phase.explicit, Phase.generate), print_blob=False,
              suppress_health_check=(HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much))
    @given(st.data())
    def prop(data):
        case(data.draw, backend)

    prop()


class Data:
    """Tensors of one example, all drawn from one seed (so the example replays from its printed draws)."""

    def __init__(self, draw, backend: str):
        self.draw, self.backend = draw, backend
        self.device = testing.device_for(backend)
        self.gen = testing.generator(draw(st.integers(0, 2**31 - 1), label="seed"))

    def randn(self, *shape, dtype=torch.float32, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=self.gen) * scale).to(device=self.device, dtype=dtype)

    def dtype(self, op: str, interpreter: tuple[torch.dtype, ...] = testing.DTYPES) -> torch.dtype:
        """A dtype the backend's implementation of `op` declares; under the Triton interpreter only those of
        `interpreter` (an op whose Triton kernel uses tl.dot passes fp32/fp16: the interpreter's bf16 tl.dot is
        wrong)."""
        dts = tuple(dt for dt in testing.DTYPES if dt in registry.impl(op, self.backend).dtypes)
        if self.backend == "triton" and INTERP:
            dts = tuple(dt for dt in dts if dt in interpreter)
        return self.draw(st.sampled_from(dts), label="dtype")

    def place(self, t: torch.Tensor, label: str, layouts=LAYOUTS) -> torch.Tensor:
        """t's values in a drawn memory layout; memory around a view holds NaN, so a read outside it shows."""
        kind = self.draw(st.sampled_from(layouts), label=f"{label} layout")
        nan = float("nan")
        if kind == "offset":
            buf = torch.full((t.numel() + 3,), nan, dtype=t.dtype, device=t.device)
            view = buf[3:].view(t.shape)
        elif kind == "strided" and t.dim():
            buf = torch.full((*t.shape[:-1], t.shape[-1] + 5), nan, dtype=t.dtype, device=t.device)
            view = buf[..., 2:2 + t.shape[-1]]
        elif kind == "transposed" and t.dim() >= 2:
            view = torch.full(t.shape[:-2] + t.shape[-2:][::-1], nan, dtype=t.dtype, device=t.device).transpose(-1, -2)
        else:
            return t.clone()
        view.copy_(t)
        return view

    def extra(self, dtype, ref32) -> float:
        return testing.interpreter_extra(self.backend, dtype, ref32)


def lowp_or_none(dtype, fn):
    return None if dtype == torch.float32 else fn()


def lead_dims(d: Data, small: bool) -> tuple[int, ...]:
    rows = st.sampled_from((1, 2, 5, 17)) if small else st.sampled_from((1, 2, 5, 17, 129))
    return d.draw(st.one_of(st.tuples(rows), st.tuples(st.integers(1, 3), rows)), label="leading dims")


def is_small(d: Data) -> bool:
    return d.backend == "triton" and INTERP


def out_mode(d: Data, xv: torch.Tensor, shape, dtype, inplace_target):
    """None (a new tensor), a NaN-poisoned separate `out`, or in place over `inplace_target` (when allowed)."""
    modes = ("new", "out") + (("inplace",) if inplace_target is not None else ())
    mode = d.draw(st.sampled_from(modes), label="out")
    if mode == "new":
        return None
    if mode == "out":
        return testing.poison(torch.empty(shape, dtype=dtype, device=d.device))
    return inplace_target


def draw_split(draw, total: int, label: str, n: int | None = None) -> list[int]:
    """cu_seqlens of a random split of `total` tokens into n (drawn: 1..5) sequences, empty sequences allowed."""
    n = draw(st.integers(1, 5), label=f"{label} sequences") if n is None else n
    cuts = sorted(draw(st.lists(st.integers(0, total), min_size=n - 1, max_size=n - 1), label=f"{label} cuts"))
    return [0, *cuts, total]


def cu_tensor(cu: list[int], device) -> torch.Tensor:
    return torch.tensor(cu, dtype=torch.int32, device=device)


def positions_of(cu: list[int], device) -> torch.Tensor:
    """Each packed token's position inside its own sequence, from the split itself (not from fastenc)."""
    pos = list(itertools.chain.from_iterable(range(e - a) for a, e in zip(cu, cu[1:])))
    return torch.tensor(pos, dtype=torch.int64, device=device)


def draw_rank(d: Data) -> int:
    return d.draw(st.sampled_from((1, 2, 3, 8, 16)), label="rank")


def draw_features(d: Data, label: str) -> int:
    sizes = (1, 3, 17, 64, 129) if is_small(d) else (1, 3, 17, 64, 129, 384, 1001)
    return d.draw(st.sampled_from(sizes), label=label)


def cu_of_lengths(*lengths: int) -> torch.Tensor:
    """int32 cu_seqlens of sequences of these lengths."""
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32)


def randn_grad(*shape: int, dtype=torch.float32) -> torch.Tensor:
    """testing.randn data that requires grad."""
    return testing.randn(*shape, dtype=dtype).requires_grad_()
