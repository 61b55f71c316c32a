"""PEFT parity for ALBERT, whose layers share one block: an adapter on its query/value (PEFT's usual targets; peft has
no ALBERT entry of its own), merged or unmerged, gives PEFT's outputs, the shared Wqkv adapted once and applied at
each of its uses; a SEQ_CLS adapter folder (LoRA under 'albert.' plus a trained classifier copy) gives PEFT's logits."""
from __future__ import annotations

import pytest
import torch

import fastenc
import _models_hf as _hf
from _peft_helpers import close, peft_model
from fastenc.lora import LoraLinear, default_targets


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
def test_albert_query_value_matches_peft(merge):
    hf = _hf.albert("base", hidden=48, heads=3, groups=2, inner=2, layers=3)
    pm = peft_model(hf, r=8, lora_alpha=16, target_modules=list(default_targets(fastenc.from_hf(hf))))
    ids, mask, types = _hf.text_batch([17, 1, 40], seed=3)
    with torch.no_grad():
        ref = pm(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        base = hf(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    assert float((ref - base)[mask.bool()].abs().max()) > 0.05, "the adapter must change the outputs"
    fe = fastenc.from_hf(hf)
    fe.load_lora(pm, merge=merge)
    if not merge:  # one adapted Wqkv per distinct block (2 groups x 2), each run at every use
        assert sum(isinstance(m, LoraLinear) for m in fe.modules()) == 4
    close(fe(ids, mask, types), ref, mask)


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
def test_albert_classifier_adapter_folder(tmp_path, merge):
    hf = _hf.albert("sequence_classification", hidden=48, heads=3)
    pm = peft_model(hf, task_type="SEQ_CLS", r=8, lora_alpha=16, target_modules=["query", "value"])
    pm.save_pretrained(tmp_path)
    ids, mask, types = _hf.text_batch([9, 30], seed=6)
    with torch.no_grad():
        ref = pm(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        base = hf(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
    assert float((ref - base).abs().max()) > 0.05, "the adapter must change the logits"
    fe = fastenc.from_hf(hf)
    fe.load_lora(tmp_path, merge=merge)
    close(fe(ids, mask, types), ref)
