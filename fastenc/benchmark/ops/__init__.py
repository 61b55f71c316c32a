"""One benchmark spec per op: `fastenc/benchmark/ops/<op>.py` declares the op's forward cases (model shapes, the
`--quick` subset, the long sweep), its inputs and baselines, its bytes/FLOPs model and, where the op trains, its
forward + backward case. `fastenc bench kernels` (and `--backward`), the pytest-benchmark entry in bench/ and the
GPU check iterate `specs()`; a new op's spec is found here with no other edit.

A spec module defines:
  OP, ORDER, BOUND       the op's name, its place in tables (ascending), "memory" or "compute"
  cases()                model-shaped Cases (quick=True on the ones `--quick` keeps)
  sweep(seq)             optional: the op's cases of the long-sequence sweep at batch 1 x seq
  work(case, e)          (bytes, flops) an ideal kernel moves and computes at element size e
  setup(case, device, dtype, generator, seed) -> OpInputs
  BASELINES, CUDA_PEERS  optional: baseline names (default torch-eager) and GPU-only peers
  NOT_COMPILED           optional: why torch.compile of the reference is not run
  backward_case(quick), backward_setup(case, device, dtype) -> BwdInputs   optional: the training benchmark
  BACKWARD_BASELINE, BACKWARD_TARGET, BACKWARD_ORDER, backward_select(bench)  optional, with defaults below
"""
from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

from fastenc.benchmark.ops._common import SWEEP, BwdCase, BwdInputs, Case, OpInputs

_SPECS: dict[str, ModuleType] | None = None


def specs() -> dict[str, ModuleType]:
    """op -> its spec module, every module of this package not starting with '_', in ORDER."""
    global _SPECS
    if _SPECS is None:
        found = {}
        for info in pkgutil.iter_modules(__path__):
            if info.name.startswith("_"):
                continue
            mod = importlib.import_module(f"{__name__}.{info.name}")
            if mod.OP in found:
                raise ValueError(f"benchmark spec of {mod.OP!r} declared twice")
            found[mod.OP] = mod
        _SPECS = dict(sorted(found.items(), key=lambda kv: (kv[1].ORDER, kv[0])))
    return _SPECS


def spec(op: str) -> ModuleType:
    table = specs()
    if op not in table:
        raise ValueError(f"no benchmark spec for op {op!r}; known: {sorted(table)}")
    return table[op]


def forward_cases(sweep: bool) -> list[Case]:
    """Every spec's model cases, then (sweep) the long sweep, sequence length by sequence length."""
    out = [c for s in specs().values() for c in s.cases()]
    if sweep:
        out += [c for seq in SWEEP for s in specs().values() if hasattr(s, "sweep") for c in s.sweep(seq)]
    return out


def baselines(op: str) -> tuple[str, ...]:
    return getattr(spec(op), "BASELINES", ("torch-eager",))


def cuda_peers(op: str) -> tuple[str, ...]:
    return getattr(spec(op), "CUDA_PEERS", ())


def not_compiled(op: str) -> str | None:
    return getattr(spec(op), "NOT_COMPILED", None)


def backward_specs() -> dict[str, ModuleType]:
    """op -> spec, the ops with a forward + backward benchmark, in BACKWARD_ORDER (default ORDER)."""
    found = [(op, s) for op, s in specs().items() if hasattr(s, "backward_case")]
    return dict(sorted(found, key=lambda kv: getattr(kv[1], "BACKWARD_ORDER", kv[1].ORDER)))


def backward_baseline(op: str) -> str:
    return getattr(spec(op), "BACKWARD_BASELINE", "torch-eager")


def backward_target(op: str) -> str:
    return getattr(spec(op), "BACKWARD_TARGET", ">= torch-eager, within 10% of torch-compile")


def backward_select(op: str, bench: BwdInputs) -> dict:
    fn = getattr(spec(op), "backward_select", None)
    return fn(bench) if fn is not None else {"x": bench.leaves[0]}


__all__ = ["specs", "spec", "forward_cases", "baselines", "cuda_peers", "not_compiled", "backward_specs",
           "backward_baseline", "backward_target", "backward_select", "Case", "BwdCase", "BwdInputs", "OpInputs"]
