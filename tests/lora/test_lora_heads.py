"""LoRA on heads that PEFT saves whole (modules_to_save): question answering (PEFT's QUESTION_ANS saves qa_outputs)
for BERT and RoBERTa, and DeiT's two classifiers (cls_classifier, distillation_classifier). add_lora + save_lora are
loaded by PEFT with its outputs; PEFT's folders are read by load_lora with its outputs."""
from __future__ import annotations

import json

import pytest
import torch
from peft import PeftModel

import fastenc
import _models_hf as _hf
from _peft_helpers import close, peft_model


def _train_a_little(fe, seed=3):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in fe.parameters():
            if p.requires_grad:
                p.add_(0.1 * torch.randn(p.shape, generator=g))


def _qa_batch(arch):
    if arch == "roberta":
        return _hf.roberta_batch([13, 4, 21], seed=2)
    return _hf.text_batch([13, 4, 21], seed=2)[:2]


@pytest.mark.parametrize("arch", ["bert", "roberta"])
def test_question_answering_adapter_saves_qa_outputs_as_peft(arch, tmp_path):
    hf = getattr(_hf, arch)("question_answering")
    fe = fastenc.from_hf(hf)
    fe.add_lora(r=4, lora_alpha=8, target_modules=["query", "value"])
    trainable = {n for n, p in fe.named_parameters() if p.requires_grad}
    assert {"qa_outputs.lora.default.weight", "qa_outputs.lora.default.bias"} <= trainable
    _train_a_little(fe)
    fe.save_lora(tmp_path / "mine")
    config = json.loads((tmp_path / "mine" / "adapter_config.json").read_text())
    assert (config["task_type"], config["modules_to_save"]) == ("QUESTION_ANS", ["qa_outputs"])
    ids, mask = _qa_batch(arch)
    m = mask.bool()
    pm = PeftModel.from_pretrained(getattr(_hf, arch)("question_answering"), tmp_path / "mine").eval()
    with torch.no_grad():
        ref, base = pm(input_ids=ids, attention_mask=mask), hf(input_ids=ids, attention_mask=mask)
        start, end = fe(ids, mask)
    assert float((ref.start_logits - base.start_logits)[m].abs().max()) > 0.05, "the adapter must change the logits"
    close(start, ref.start_logits, mask)
    close(end, ref.end_logits, mask)
    # PEFT's own QUESTION_ANS folder (LoRA plus a trained qa_outputs copy) read back, merged and unmerged
    theirs = peft_model(hf, task_type="QUESTION_ANS", r=8, lora_alpha=16, target_modules=["query", "value"])
    theirs.save_pretrained(tmp_path / "theirs")
    with torch.no_grad():
        ref = theirs(input_ids=ids, attention_mask=mask)
    for merge in (True, False):
        back = fastenc.from_hf(hf)
        back.load_lora(tmp_path / "theirs", merge=merge)
        with torch.no_grad():
            start, end = back(ids, mask)
        close(start, ref.start_logits, mask)
        close(end, ref.end_logits, mask)


@pytest.mark.parametrize("saves", [["cls_classifier", "distillation_classifier"], ["classifier"]],
                         ids=["both-names", "suffix"])
def test_deit_teacher_classifiers_as_modules_to_save(saves, tmp_path):
    # PEFT matches modules_to_save by suffix: "classifier" takes both of DeiT's heads
    hf = _hf.deit("image_classification_with_teacher")
    px = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    fe = fastenc.from_hf(hf)
    fe.add_lora(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], modules_to_save=saves)
    trainable = {n for n, p in fe.named_parameters() if p.requires_grad}
    assert {f"{h}.lora.default.{w}" for h in ("cls_classifier", "distillation_classifier")
            for w in ("weight", "bias")} <= trainable
    _train_a_little(fe)
    fe.save_lora(tmp_path / "mine")
    pm = PeftModel.from_pretrained(_hf.deit("image_classification_with_teacher"), tmp_path / "mine").eval()
    with torch.no_grad():
        ref, base, out = pm(pixel_values=px).logits, hf(pixel_values=px).logits, fe(px)
    assert float((ref - base).abs().max()) > 0.05, "the adapter must change the logits"
    close(out, ref)
    theirs = peft_model(hf, r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], modules_to_save=saves)
    theirs.save_pretrained(tmp_path / "theirs")
    with torch.no_grad():
        ref = theirs(pixel_values=px).logits
    for merge in (True, False):
        back = fastenc.from_hf(hf)
        back.load_lora(tmp_path / "theirs", merge=merge)
        with torch.no_grad():
            close(back(px), ref)
