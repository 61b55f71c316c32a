"""The corpus job runs every GEMM on fastenc's panel GEMM (fastenc.layers.prepack.pinned), never on a measured
choice: its rows do not depend on batching or on a timing, so they equal encode() on the panel GEMM bit for bit
whatever the process would have measured, and the choice stays measured outside the job."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import fastenc
from fastenc.layers import prepack


@pytest.fixture
def torch_measured_faster(monkeypatch):
    """A fresh choice cache in "auto" mode where every measurement answers torch's GEMM; the calls are recorded."""
    calls = []
    monkeypatch.delenv("FASTENC_GEMM", raising=False)
    monkeypatch.setattr(prepack, "_CHOICE", {})
    monkeypatch.setattr(prepack, "_MODE", [])
    monkeypatch.setattr(prepack, "measure_choice", lambda x, w, rounds=3: calls.append(x.shape[0]) or False)
    return calls


def test_job_rows_are_the_panel_gemms(minilm, texts, torch_measured_faster):
    calls = torch_measured_faster
    body = texts[:40]
    got = fastenc.embed(body, minilm, window=40, max_batch_tokens=4096).embeddings  # batches past 128 rows
    assert calls == []  # nothing measured inside the job
    with prepack.pinned("panels"):
        want = minilm.encode(body, batch_size=len(body)).numpy()
    np.testing.assert_array_equal(got, want)
    with torch.inference_mode():
        minilm.encode(body, batch_size=len(body))  # outside the job: the measured choice again
    assert calls and min(calls) >= prepack.CHOICE_MIN_ROWS


def test_pinned_keeps_an_explicit_mode(monkeypatch):
    monkeypatch.setattr(prepack, "_MODE", ["torch"])
    w = torch.empty(8, 4)
    with prepack.pinned("panels"):
        assert prepack.gemm_mode() == "torch" and not prepack.panels_chosen(torch.empty(500, 4), w)
    monkeypatch.setattr(prepack, "_MODE", ["auto"])
    with prepack.pinned("panels"):
        assert prepack.panels_chosen(torch.empty(500, 4), w)
    assert prepack.gemm_mode() == "auto"
    with pytest.raises(ValueError, match="pinned: mode"):
        with prepack.pinned("mkl"):
            pass
