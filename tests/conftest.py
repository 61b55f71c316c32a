"""Test session setup: the Triton interpreter on before triton is imported (CPU-only CI), and reproducible data.

Seeds: every test's random data derives from its node id. Before each test, an autouse fixture sets the test's
base seed to a stable hash of the node id (fastenc.testing.seed_for_test: sha256, the same in every process),
restarts fastenc.testing.randn's per-test counter (the n-th call of the test draws from stable_seed(base, n)),
and seeds torch's global generator and Python's `random` from the base too, so direct torch.rand* calls in a
test are reproducible as well. A failing test's report carries a section

    fastenc seed: tests/ops/test_x.py::test_y[cpu-fp16] base 1234567890123

Replay: run the same node id again (`python -m pytest 'tests/ops/test_x.py::test_y[cpu-fp16]'`): it draws the
same data. To draw other data (or replay a base printed elsewhere), set FASTENC_TEST_SEED=<integer>: it replaces
the base seed of every test in the run, e.g. `FASTENC_TEST_SEED=1234567890123 python -m pytest '<node id>'`.
"""
import os
import random

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
torch.manual_seed(0)

_SEED_KEY = pytest.StashKey[int]()


@pytest.fixture(autouse=True)
def _fastenc_seed(request):
    """Per-test base seed from the node id (or FASTENC_TEST_SEED); see the module docstring."""
    from fastenc import testing

    base = testing.set_test_seed(request.node.nodeid)
    request.node.stash[_SEED_KEY] = base
    torch.manual_seed(testing.stable_seed(base, "torch"))
    random.seed(testing.stable_seed(base, "random"))
    yield base


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    base = item.stash.get(_SEED_KEY, None)
    if base is not None and report.failed:
        report.sections.append(("fastenc seed", f"fastenc seed: {item.nodeid} base {base}"))
    return report
