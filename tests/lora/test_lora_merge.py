"""Folding a trained adapter into the weights: merge_and_unload (PEFT's) leaves a plain model with the adapted
outputs, whose save_pretrained checkpoint transformers loads with the same outputs and equals PEFT's own
merge_and_unload of the same adapter; merge_lora is undone by unmerge_lora; bad calls change nothing."""
from __future__ import annotations

import pytest
import torch

import fastenc
import _models_hf as _hf
from _peft_helpers import close, same_state, snapshot
from fastenc.lora import LoraLinear

# (task, LoRA targets): BERT's query/value land on thirds of the fused Wqkv; the classifier is a saved copy.
CASES = {"bert": ("sequence_classification", ["query", "value", "dense"]),
         "modernbert": ("token_classification", ["Wqkv", "Wo"]),
         "vit": ("image_classification", ["q_proj", "v_proj", "fc1"])}


def _hf_model(arch, task):
    return _hf.vit(task, image=32) if arch == "vit" else getattr(_hf, arch)(task)


def _inputs(arch):
    if arch == "vit":
        return {"pixel_values": torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))}
    ids, mask, _ = _hf.text_batch([13, 4, 21], seed=2)
    return {"input_ids": ids, "attention_mask": mask}


def _fe_out(fe, kw):
    with torch.no_grad():
        return fe(kw["pixel_values"]) if "pixel_values" in kw else fe(kw["input_ids"], kw["attention_mask"])


def _hf_out(model, kw):
    with torch.no_grad():
        return model(**kw).logits


def _trained(fe, seed, **kw):
    """add_lora, then move every trainable tensor (A, B, the head copy) as training would."""
    fe.add_lora(**kw)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in fe.parameters():
            if p.requires_grad:
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    return fe


@pytest.mark.parametrize("arch", list(CASES))
def test_merge_and_unload_saves_a_plain_checkpoint(arch, tmp_path):
    from peft import PeftModel

    task, targets = CASES[arch]
    hf = _hf_model(arch, task).eval()
    fe = _trained(fastenc.from_hf(hf), 3, r=4, lora_alpha=8, target_modules=targets).eval()
    kw = _inputs(arch)
    mask = kw.get("attention_mask") if arch != "vit" and task != "sequence_classification" else None
    adapted = _fe_out(fe, kw)
    assert float((adapted - _hf_out(hf, kw)).abs().max()) > 0.02, "the adapter must change the outputs"
    fe.save_lora(tmp_path / "adapter")
    assert fe.merge_and_unload() is fe
    assert not any(isinstance(m, LoraLinear) for m in fe.modules())
    assert set(fe.state_dict()) == set(fastenc.from_hf(hf).state_dict())
    assert fe.lora_adapters == {"merged": [], "unmerged": [], "active": None}
    close(_fe_out(fe, kw), adapted, mask)
    fe.save_pretrained(tmp_path / "merged")
    loaded = type(hf).from_pretrained(tmp_path / "merged", attn_implementation="eager").eval()
    close(_hf_out(loaded, kw), adapted, mask)
    peft_merged = PeftModel.from_pretrained(_hf_model(arch, task), tmp_path / "adapter").merge_and_unload()
    theirs = peft_merged.state_dict()
    for name, t in loaded.state_dict().items():
        torch.testing.assert_close(t, theirs[name], rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")


def test_merge_lora_is_undone_by_unmerge_and_made_permanent_by_unload():
    hf = _hf.bert("sequence_classification")
    fe = fastenc.from_hf(hf)
    base, base_grads = snapshot(fe), {n: p.requires_grad for n, p in fe.named_parameters()}
    _trained(fe, 5, r=2, target_modules=["key"], adapter_name="a")
    ids, mask, types = _hf.text_batch([9, 30, 1], seed=1)
    fe.eval()
    with torch.no_grad():
        adapted = fe(ids, mask, types)
    assert fe.merge_lora() == "a"
    assert fe.lora_adapters == {"merged": ["a"], "unmerged": [], "active": None}
    with torch.no_grad():
        close(fe(ids, mask, types), adapted)
    fe.train()
    with pytest.raises(RuntimeError, match=r"adapter\(s\) \['a'\] are merged into the weights"):
        fe(ids, mask, types)
    fe.unmerge_lora()
    assert same_state(fe, base)  # bit for bit, adapter gone
    fe.eval()
    _trained(fe, 6, r=2, target_modules=["query"], adapter_name="b")
    fe.merge_lora("b")
    merged = snapshot(fe)
    fe.merge_and_unload()  # nothing unmerged left: the earlier merge becomes permanent
    assert same_state(fe, merged) and fe.lora_adapters["merged"] == []
    fe.unmerge_lora()
    assert same_state(fe, merged)
    for p in fe.parameters():
        p.requires_grad_(True)
    fe.train()(ids, mask, types, labels=torch.tensor([0, 1, 1])).loss.backward()  # trains as a plain model
    assert set(base_grads) == {n for n, p in fe.named_parameters() if p.grad is not None}


def test_merge_and_unload_merges_the_active_adapter_only():
    fe = fastenc.from_hf(_hf.bert("base"))
    _trained(fe, 7, r=2, target_modules=["value"], adapter_name="a")
    _trained(fe, 8, r=3, target_modules=["query", "value"], adapter_name="b")
    fe.set_adapter("a")
    fe.eval()
    ids, mask, types = _hf.text_batch([7, 12], seed=3)
    with torch.no_grad():
        only_a = fe(ids, mask, types)
        with fe.use_adapter("b"):
            only_b = fe(ids, mask, types)
    fe.merge_and_unload()
    assert fe.lora_adapters["unmerged"] == [] and not any(isinstance(m, LoraLinear) for m in fe.modules())
    with torch.no_grad():
        out = fe(ids, mask, types)
    close(out, only_a, mask)
    assert float((out - only_b)[mask.bool()].abs().max()) > 1e-3


BAD = {
    "unknown-name": (lambda fe: fe.merge_lora("nope"), ValueError, r"merge_lora: adapter\(s\) \['nope'\] are not"),
    "repeated": (lambda fe: fe.merge_and_unload(["a", "a"]), ValueError, "are not distinct unmerged adapters"),
    "names-str": (lambda fe: fe.merge_and_unload("a"), TypeError, "adapter_names must be None or a list"),
    "no-active": (lambda fe: (fe.set_adapter(None), fe.merge_and_unload()), ValueError, "no active adapter"),
    "safe-merge-nan": (lambda fe: fe.merge_and_unload(safe_merge=True), ValueError,
                       "merge_and_unload: safe_merge: adapter 'a' produces non-finite"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_merge_changes_nothing(case):
    fe = fastenc.from_hf(_hf.bert("base", layers=1))
    _trained(fe, 1, r=2, target_modules=["query"], adapter_name="a")
    call, exc, msg = BAD[case]
    if case == "safe-merge-nan":  # a diverged adapter
        fe.layers[0].attn.Wqkv.lora["a"].lora_B["q"].data.fill_(float("nan"))
    snap = {k: v.clone() for k, v in fe.state_dict().items()}
    with pytest.raises(exc, match=msg):
        call(fe)
    now = fe.state_dict()
    assert set(now) == set(snap)
    for k in snap:
        torch.testing.assert_close(now[k], snap[k], rtol=0, atol=0, equal_nan=True)
    assert fe.lora_adapters["merged"] == [] and fe.lora_adapters["unmerged"] == ["a"]


def test_save_pretrained_refuses_unmerged_adapters(tmp_path):
    fe = fastenc.from_hf(_hf.bert("sequence_classification", layers=1))
    _trained(fe, 2, r=2, target_modules=["query"])
    with pytest.raises(ValueError, match=r"carries unmerged LoRA adapter\(s\) \['default'\]; call merge_and_unload"):
        fe.save_pretrained(tmp_path / "m")
    assert not (tmp_path / "m").exists()
    fe.merge_and_unload().save_pretrained(tmp_path / "m")
    assert (tmp_path / "m" / "model.safetensors").is_file()


def test_merge_without_adapter():
    fe = fastenc.from_hf(_hf.bert("base", layers=1))
    with pytest.raises(ValueError, match="merge_and_unload: BertModel has no LoRA adapter"):
        fe.merge_and_unload()
    with pytest.raises(ValueError, match="merge_lora: no active adapter to merge"):
        fe.merge_lora()
