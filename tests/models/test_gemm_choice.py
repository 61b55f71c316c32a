"""The choice between fastenc's panel GEMM and torch's GEMM for an inference Linear from CHOICE_MIN_ROWS rows
(fastenc.layers.prepack.panels_chosen): FASTENC_GEMM, one measurement per (row octave, in, out, threads), and
every Linear entry point held to fp64 on either answer, a BERT block leaving the direct plan when one of its GEMMs
goes to torch."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fastenc
from fastenc import extension, testing
from fastenc.layers import prepack
from _layers import random_linear as _linear

pytest.importorskip("transformers")


@pytest.fixture
def fresh(monkeypatch):
    """An empty choice cache and FASTENC_GEMM re-read at the next choice."""
    monkeypatch.setattr(prepack, "_CHOICE", {})
    monkeypatch.setattr(prepack, "_MODE", [])
    return monkeypatch


@pytest.fixture
def measured(fresh):
    """measure_choice replaced by a spy answering from `answers` (default True) and recording its row counts."""
    calls, answers = [], []

    def spy(x, w, rounds=3):
        calls.append((x.shape[0], tuple(w.shape)))
        return answers.pop(0) if answers else True

    fresh.setattr(prepack, "measure_choice", spy)
    fresh.delenv("FASTENC_GEMM", raising=False)
    return calls, answers


def test_mode_from_env(fresh):
    w = torch.empty(24, 16)
    fresh.setenv("FASTENC_GEMM", "fastest")
    with pytest.raises(ValueError, match="FASTENC_GEMM"):
        prepack.gemm_mode()
    for mode, want in (("torch", False), ("panels", True)):
        fresh.setattr(prepack, "_MODE", [])
        fresh.setenv("FASTENC_GEMM", mode)
        assert prepack.gemm_mode() == mode
        for rows in (1, prepack.CHOICE_MIN_ROWS, 5000):
            assert prepack.panels_chosen(torch.empty(rows, 16), w) is want
    assert prepack._CHOICE == {}  # a fixed mode measures nothing


def test_one_measurement_per_key(measured):
    calls, answers = measured
    w, w2 = torch.empty(24, 16), torch.empty(40, 16)
    answers.extend([False, True, True, False])
    assert prepack.panels_chosen(torch.empty(prepack.CHOICE_MIN_ROWS - 1, 16), w)  # few rows: panels, unmeasured
    assert calls == []
    assert not prepack.panels_chosen(torch.empty(200, 16), w)
    assert not prepack.panels_chosen(torch.empty(255, 16), w)  # the same octave: the first answer
    assert prepack.panels_chosen(torch.empty(256, 16), w)      # the next octave: measured again
    assert prepack.panels_chosen(torch.empty(200, 16), w2)     # another weight shape
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if threads > 1 else 2)
        assert not prepack.panels_chosen(torch.empty(200, 16), w)  # another thread count
    finally:
        torch.set_num_threads(threads)
    assert calls == [(200, (24, 16)), (256, (24, 16)), (200, (40, 16)), (200, (24, 16))]


def test_measure_choice_times_both():
    extension.load()
    lin = _linear(48, 72)
    with torch.inference_mode():
        for x in (testing.randn(130, 48), testing.randn(130, 96)):  # (another width: its row count only)
            assert isinstance(prepack.measure_choice(x, lin.weight, rounds=1), bool)


def _ref(x, lin, bias=True):
    return F.linear(x.double(), lin.weight.double(), lin.bias.double() if bias else None)


@pytest.mark.parametrize("panels", [True, False], ids=["panels", "torch"])
def test_every_entry_point_on_either_answer(measured, panels):
    extension.load()
    calls, answers = measured
    answers.extend([panels] * 4)
    m, k, n = 157, 40, 66
    lin = _linear(k, n)
    x, acc = testing.randn(m, k), testing.randn(m, n)
    with torch.inference_mode():
        testing.assert_close(lin(x), _ref(x, lin))
        testing.assert_close(lin(x, with_bias=False), _ref(x, lin, bias=False))
        testing.assert_close(lin.accumulate_(x, acc.clone()), acc.double() + _ref(x, lin, bias=False))
        parts = lin.planes(x, 3)
        testing.assert_close(torch.cat(parts, 1), _ref(x, lin))
        assert all(p.is_contiguous() and p.shape == (m, n // 3) for p in parts)
        g = lin.gelu_epilogue(x, "tanh")
        assert (g is not None) == panels  # torch's GEMM: the caller runs the GELU after it
        if g is not None:
            testing.assert_close(g, F.gelu(_ref(x, lin), approximate="tanh"))
    assert calls == [(m, (n, k))]  # one measurement, whatever the entry point
    assert ("_panels" in lin.__dict__) == panels and "_pack" not in lin.__dict__


def test_bert_block_leaves_the_direct_plan_for_torch_gemms(measured):
    import _models_hf as _hf
    from fastenc.models import bert

    calls, answers = measured
    direct = []
    real = bert.direct_block
    measured_fresh = prepack._CHOICE
    hf = _hf.bert("base", hidden=48, heads=2, layers=2)
    fe = fastenc.from_hf(hf)
    ids, mask, types = _hf.text_batch([90, 61], seed=3)  # 151 tokens: past CHOICE_MIN_ROWS
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    for answer in (True, False):
        measured_fresh.clear()
        answers[:] = [answer, True, True, True]  # the first GEMM measured (QKV) answers `answer`
        direct.clear()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(bert, "direct_block", lambda *a: direct.append(1) or real(*a))
            with torch.no_grad():
                out = fe(ids, attention_mask=mask, token_type_ids=types)
        err = float((out - ref)[mask.bool()].abs().max())
        assert err < 1e-4, err
        assert len(direct) == (2 if answer else 0)
