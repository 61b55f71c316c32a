"""PEFT parity for RoBERTa: an adapter on query/value, merged or unmerged, gives PEFT's outputs; a SEQ_CLS adapter
folder (LoRA under 'roberta.' plus a trained copy of the two-layer classification head) gives PEFT's logits."""
from __future__ import annotations

import pytest
import torch

import fastenc
import _models_hf as _hf
from _peft_helpers import close, peft_model


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
def test_roberta_query_value_matches_peft(merge):
    hf = _hf.roberta("base")
    pm = peft_model(hf, r=8, lora_alpha=16, target_modules=["query", "value"])
    ids, mask = _hf.roberta_batch([17, 1, 40], seed=3)
    with torch.no_grad():
        ref = pm(input_ids=ids, attention_mask=mask).last_hidden_state
        base = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    assert float((ref - base)[mask.bool()].abs().max()) > 0.05, "the adapter must change the outputs"
    fe = fastenc.from_hf(hf)
    fe.load_lora(pm, merge=merge)
    close(fe(ids, mask), ref, mask)


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
def test_roberta_classifier_adapter_folder(tmp_path, merge):
    hf = _hf.roberta("sequence_classification")
    pm = peft_model(hf, task_type="SEQ_CLS", r=8, lora_alpha=16, target_modules=["query", "value"])
    pm.save_pretrained(tmp_path)
    ids, mask = _hf.roberta_batch([9, 30], seed=6)
    with torch.no_grad():
        ref = pm(input_ids=ids, attention_mask=mask).logits
        base = hf(input_ids=ids, attention_mask=mask).logits
    assert float((ref - base).abs().max()) > 0.05, "the adapter must change the logits"
    fe = fastenc.from_hf(hf)
    fe.load_lora(tmp_path, merge=merge)
    close(fe(ids, mask), ref)
