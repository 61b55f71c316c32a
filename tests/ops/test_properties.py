"""Property tests: every op against its fp32 reference under the tolerance rule (testing.assert_close), over
random shapes (odd sizes, 1 included), dtypes, memory layouts (storage offsets, non-contiguous views whose
surroundings hold NaN) and varlen splits (empty sequences included). Each op declares its samples in
tests/ops/op_samples/<op>.py; this file runs every one on every backend of the op that runs here.

Hypothesis draws the cases; runs are derandomized (the same examples in every run, no example database) and
bounded (a few examples per backend, fewer for Triton under the interpreter). A falsifying example prints its
draws, and the tensors come from the drawn `seed`, so it replays exactly. Triton's dot-based kernels (attention,
merge_lora, lora_linear) run fp32/fp16 only under the interpreter (its bf16 tl.dot is wrong).
"""
from __future__ import annotations

import pytest

import op_samples
from fastenc import registry, testing
from op_samples._draw import run

SAMPLES = {op: mod for op, mod in op_samples.modules().items() if hasattr(mod, "case")}
CASES = [pytest.param(op, backend, id=f"{op}-{backend}") for op in SAMPLES for backend in testing.backends_for(op)]


def test_every_sample_module_draws_for_a_registered_op():
    assert len(SAMPLES) >= 8, sorted(SAMPLES)
    assert set(SAMPLES) <= set(registry.ops()), sorted(set(SAMPLES) - set(registry.ops()))
    assert set(op_samples.modules()) <= set(registry.ops())


@pytest.mark.parametrize("op,backend", CASES)
def test_matches_the_reference(op, backend):
    run(backend, SAMPLES[op].case)
