"""pytest-benchmark entry to the kernel benchmarks: `pytest bench/ --benchmark-only` runs every op x provider at
the cases of each op's benchmark spec (fastenc/benchmark/ops/<op>.py) through the `benchmark` fixture, one group
per op.

Options: --bench-device cpu|cuda (default: cuda if available), --bench-dtype fp32|fp16|bf16 (default: bf16 on
cuda, fp32 on cpu), --bench-quick (one shape per op), --bench-long (add the long-sequence sweep).
"""
from __future__ import annotations

import pytest
import torch

import fastenc  # noqa: F401  (registers every op)
from fastenc import registry
from fastenc.benchmark import kernels
from fastenc.benchmark import ops as op_specs

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def pytest_addoption(parser):
    g = parser.getgroup("fastenc kernel benchmarks")
    g.addoption("--bench-device", default=None, help="cpu or cuda (default: cuda if available)")
    g.addoption("--bench-dtype", default=None, choices=sorted(DTYPES), help="default: bf16 on cuda, fp32 on cpu")
    g.addoption("--bench-quick", action="store_true", help="one model shape per op")
    g.addoption("--bench-long", action="store_true", help="add the long-sequence sweep")


def _device(config) -> str:
    return config.getoption("--bench-device") or ("cuda" if torch.cuda.is_available() else "cpu")


def _dtype(config) -> torch.dtype:
    name = config.getoption("--bench-dtype")
    return DTYPES[name] if name else (torch.bfloat16 if _device(config).startswith("cuda") else torch.float32)


def pytest_generate_tests(metafunc):
    if "kcase" not in metafunc.fixturenames:
        return
    cfg = metafunc.config
    device = _device(cfg)
    quick = cfg.getoption("--bench-quick")
    known = set(registry.ops())
    cs = [c for c in kernels.cases(quick=quick, sweep=cfg.getoption("--bench-long")) if c.op in known]
    provs = {op: kernels.provider_names(op, device) for op in op_specs.specs() if op in known}
    params = [(c, p) for c in cs for p in provs[c.op]]
    ids = [f"{c.op}-{p}-{c.shape.replace(' ', '_')}" for c, p in params]
    metafunc.parametrize(("kcase", "provider"), params, ids=ids)


@pytest.fixture
def kernel_bench(benchmark, kcase, provider, request):
    """Set up `kcase` for `provider` and time it with pytest-benchmark; records bytes/FLOPs and GB/s, TFLOP/s."""

    def run():
        device, dtype = _device(request.config), _dtype(request.config)
        st = kernels.setup(kcase, device, dtype, compile_ref=provider == "torch-compile")
        fns = {f"fastenc-{k}": v for k, v in st.fastenc.items()}
        fns.update(st.others)
        if provider not in fns:
            pytest.skip(st.skipped.get(provider, f"{provider} not available"))
        fn = fns[provider]
        try:
            fn()  # builds / compiles outside the timing
        except Exception as e:
            if provider.startswith("fastenc-"):
                raise
            pytest.skip(f"{provider} failed on these inputs: {type(e).__name__}: {e}"[:300])
        if torch.device(device).type == "cuda":
            def timed():
                fn()
                torch.cuda.synchronize()
        else:
            timed = fn
        benchmark.group = kcase.op
        nbytes, flops = kernels.work(kcase, dtype)
        benchmark.extra_info.update(shape=kcase.shape, source=kcase.source, provider=provider, bytes=nbytes,
                                    flops=flops, dtype=str(dtype).replace("torch.", ""), device=device)
        benchmark(timed)
        if benchmark.stats is not None:  # (None under --benchmark-disable: the call ran once, untimed)
            med = benchmark.stats.stats.median
            benchmark.extra_info.update(gb_s=nbytes / med / 1e9, tflop_s=flops / med / 1e12)

    return run
