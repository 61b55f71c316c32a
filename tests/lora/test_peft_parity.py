"""PEFT parity: a PEFT-wrapped transformers model and fastenc with the same adapter merged or unmerged give the
same outputs (BERT, ModernBERT, ViT targets); exact unmerge; two adapters switched per call; folder loading."""
from __future__ import annotations

import pytest
import torch

import fastenc
import _models_hf as _hf
from _peft_helpers import close, peft_model, same_state, snapshot
from fastenc.lora import LoraLinear

BERT_TARGETS = {"qv": dict(r=8, lora_alpha=16, target_modules=["query", "value"]),
                "all-rslora": dict(r=4, lora_alpha=8, use_rslora=True,
                                   target_modules=["query", "key", "value", "dense"])}


def _ref(pm, ids, mask, types=None):
    with torch.no_grad():
        kw = {} if types is None else {"token_type_ids": types}
        return pm(input_ids=ids, attention_mask=mask, **kw).last_hidden_state


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
@pytest.mark.parametrize("targets", list(BERT_TARGETS), ids=list(BERT_TARGETS))
def test_bert_matches_peft(targets, merge):
    hf = _hf.bert("base")
    pm = peft_model(hf, **BERT_TARGETS[targets])
    ids, mask, types = _hf.text_batch([17, 1, 40], seed=3)
    ref, base = _ref(pm, ids, mask, types), _ref(hf, ids, mask, types)
    assert float((ref - base)[mask.bool()].abs().max()) > 0.05, "the adapter must change the outputs"
    fe = fastenc.from_hf(hf)
    fe.load_lora(pm, merge=merge)
    close(fe(ids, mask, types), ref, mask)
    if targets == "all-rslora":  # the pooler's dense is a target too
        with torch.no_grad():
            pooled = pm(input_ids=ids, attention_mask=mask, token_type_ids=types).pooler_output
        close(fe.pool(fe(ids, mask, types)), pooled)


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
def test_modernbert_matches_peft(merge):
    hf = _hf.modernbert("base")
    pm = peft_model(hf, r=8, lora_alpha=16, target_modules=["Wqkv", "Wo", "Wi"])
    ids, mask, _ = _hf.text_batch([150, 17, 1], seed=4)
    ref = _ref(pm, ids, mask)
    fe = fastenc.from_hf(hf)
    fe.load_lora(pm, merge=merge)
    close(fe(ids, mask), ref, mask)


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
def test_vit_matches_peft(merge):
    hf = _hf.vit("base", image=64)
    pm = peft_model(hf, r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "fc1", "fc2"])
    px = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = pm(pixel_values=px).last_hidden_state
    fe = fastenc.from_hf(hf)
    fe.load_lora(pm, merge=merge)
    close(fe(px), ref)


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
def test_folder_and_classifier_head(tmp_path, merge):
    """adapter_config.json + adapter_model.safetensors of a SEQ_CLS adapter: LoRA on the encoder (prefix 'bert.')
    plus a trained copy of the classifier (PEFT's modules_to_save)."""
    hf = _hf.bert("sequence_classification")
    pm = peft_model(hf, task_type="SEQ_CLS", r=8, lora_alpha=16, target_modules=["query", "value"])
    pm.save_pretrained(tmp_path)
    ids, mask, types = _hf.text_batch([9, 30], seed=6)
    with torch.no_grad():
        ref = pm(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        base = hf(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
    assert float((ref - base).abs().max()) > 0.05, "the adapter must change the logits"
    fe = fastenc.from_hf(hf)
    snap = snapshot(fe)
    fe.load_lora(tmp_path, merge=merge)
    close(fe(ids, mask, types), ref)
    if merge:
        fe.unmerge_lora()
        assert same_state(fe, snap)
    else:
        close(fe(ids, mask, types, adapter=None), base)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_unmerge_restores_exactly(dtype):
    hf = _hf.bert("base")
    fe = fastenc.from_hf(hf).to(dtype)
    snap = snapshot(fe)
    fe.load_lora(peft_model(hf, seed=1, r=8, lora_alpha=16, target_modules=["query", "key", "value", "dense"]))
    fe.load_lora(peft_model(hf, seed=2, r=4, lora_alpha=4, target_modules=["value"]), adapter_name="second")
    assert not same_state(fe, snap)
    assert fe.lora_adapters["merged"] == ["default", "second"]
    fe.unmerge_lora()
    assert same_state(fe, snap), "unmerge must restore the original weights bit for bit"
    assert fe.lora_adapters["merged"] == []


def test_two_adapters_switched_per_call():
    hf = _hf.bert("base")
    pa = peft_model(hf, seed=1, r=8, lora_alpha=16, target_modules=["query", "value"])
    pb = peft_model(hf, seed=2, r=16, lora_alpha=8, target_modules=["key", "dense"])
    ids, mask, types = _hf.text_batch([17, 5], seed=7)
    ref_a, ref_b, base = _ref(pa, ids, mask, types), _ref(pb, ids, mask, types), _ref(hf, ids, mask, types)
    fe = fastenc.from_hf(hf)
    snap = snapshot(fe)
    fe.load_lora(pa, merge=False, adapter_name="a")
    fe.load_lora(pb, merge=False, adapter_name="b")
    assert same_state(fe, snap, new_keys_ok=True), "unmerged adapters must not touch the weights"
    close(fe(ids, mask, types, adapter="b"), ref_b, mask)
    close(fe(ids, mask, types, adapter="a"), ref_a, mask)
    close(fe(ids, mask, types, adapter=None), base, mask)
    close(fe(ids, mask, types), ref_a, mask)  # the first loaded is the default
    fe.set_adapter("b")
    close(fe(ids, mask, types), ref_b, mask)
    with fe.use_adapter(None):
        close(fe(ids, mask, types), base, mask)
    with pytest.raises(ValueError, match="adapter 'c' is not loaded"):
        fe(ids, mask, types, adapter="c")
    fe.remove_lora()
    assert not any(isinstance(m, LoraLinear) for m in fe.modules())
    close(fe(ids, mask, types), base, mask)


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
def test_modules_to_save_inside_the_encoder(merge):
    """A trained copy of a layer whose bias fastenc fuses elsewhere (the attention output dense, whose bias goes
    into the next LayerNorm; fc1's into the GELU): the copy's own bias must be the one used."""
    hf = _hf.bert("base")
    pm = peft_model(hf, r=4, lora_alpha=8, target_modules=["query"],
                    modules_to_save=["attention.output.dense", "intermediate.dense"])
    ids, mask, types = _hf.text_batch([23, 8], seed=8)
    with torch.no_grad():
        ref = pm(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    fe = fastenc.from_hf(hf)
    fe.load_lora(pm, merge=merge)
    close(fe(ids, mask, types), ref, mask)
