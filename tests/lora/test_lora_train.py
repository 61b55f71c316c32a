"""LoRA training with PEFT's names and files: add_lora's targets, initialization and trainable set; save_lora
loaded by PEFT with equal outputs and read back by load_lora; the adapted layer's fused forward/backward (and
lora_dropout, one mask per adapted projection) against PEFT's formula; one adapter trains at a time; bad input changes nothing."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import fastenc
import _models_hf as _hf
from _peft_helpers import close, same_state, snapshot
from fastenc import testing
from fastenc.lora import LoraLinear

TARGETS = {"bert": ("sequence_classification", ["query", "value"]),
           "modernbert": ("base", ["Wqkv", "Wo"]),
           "vit": ("base", ["q_proj", "v_proj", "fc1"]),
           "albert": ("sequence_classification", ["query", "value"])}  # (one block shared by every layer)


def _hf_model(arch, task):
    return _hf.vit(task, image=32) if arch == "vit" else getattr(_hf, arch)(task)


def _inputs(arch):
    if arch == "vit":
        return {"pixel_values": torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))}
    ids, mask, _ = _hf.text_batch([13, 4, 21], seed=2)
    return {"input_ids": ids, "attention_mask": mask}


def _fe_out(fe, arch, kw):
    out = fe(kw["pixel_values"]) if arch == "vit" else fe(kw["input_ids"], kw["attention_mask"])
    return out


def _hf_out(model, kw):
    out = model(**kw)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _randomize_trainable(fe, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in fe.parameters():
            if p.requires_grad:
                p.add_(0.1 * torch.randn(p.shape, generator=g))


def test_add_lora_names_init_and_trainable_set():
    hf = _hf.bert("sequence_classification")
    fe = fastenc.from_hf(hf)
    ids, mask, types = _hf.text_batch([9, 30, 1], seed=1)
    with torch.no_grad():
        base = fe(ids, mask, types)
    torch.manual_seed(0)
    assert fe.add_lora(r=8, lora_alpha=16, target_modules=["query", "value"], lora_dropout=0.1) == "default"
    trainable = {n for n, p in fe.named_parameters() if p.requires_grad}
    want = {f"layers.{i}.attn.Wqkv.lora.default.lora_{m}.{k}" for i in range(2) for m in "AB" for k in "qv"}
    assert trainable == want | {"classifier.lora.default.weight", "classifier.lora.default.bias"}
    a, b = fe.layers[0].attn.Wqkv.lora["default"].lora_A["q"], fe.layers[0].attn.Wqkv.lora["default"].lora_B["v"]
    assert a.shape == (8, 64) and b.shape == (64, 8) and not b.any()
    bound = 1 / math.sqrt(64)  # kaiming_uniform_(a=sqrt(5)) on (r, in): U(-1/sqrt(in), 1/sqrt(in))
    assert float(a.detach().abs().max()) <= bound and float(a.detach().std()) > 0.8 * bound / math.sqrt(3)
    assert isinstance(fe.layers[1].attn.Wqkv, LoraLinear) and not isinstance(fe.layers[1].attn.Wo, LoraLinear)
    with torch.no_grad():
        close(fe(ids, mask, types), base)  # B = 0 and the head copy equals the head: outputs unchanged


@pytest.mark.parametrize("arch", list(TARGETS))
def test_save_lora_loads_in_peft_and_back(arch, tmp_path):
    from peft import PeftModel

    task, targets = TARGETS[arch]
    hf = _hf_model(arch, task)
    fe = fastenc.from_hf(hf)
    fe.add_lora(r=4, lora_alpha=8, target_modules=targets, adapter_name="tuned")
    _randomize_trainable(fe, seed=3)
    fe.save_lora(tmp_path)
    kw = _inputs(arch)
    pm = PeftModel.from_pretrained(_hf_model(arch, task), tmp_path).eval()
    with torch.no_grad():
        ref, base, out = _hf_out(pm, kw), _hf_out(hf, kw), _fe_out(fe, arch, kw)
    assert float((ref - base).abs().max()) > 0.02, "the trained adapter must change the outputs"
    close(out, ref, kw.get("attention_mask") if out.dim() == 3 else None)
    back = fastenc.from_hf(hf)
    assert back.load_lora(tmp_path, merge=False, is_trainable=True) == tmp_path.name
    assert back.lora_adapters["active"] == tmp_path.name
    mine = {n.replace(".tuned.", "."): p for n, p in fe.named_parameters() if p.requires_grad}
    theirs = {n.replace(f".{tmp_path.name}.", "."): p for n, p in back.named_parameters() if p.requires_grad}
    assert set(mine) == set(theirs) and all(torch.equal(mine[k], theirs[k]) for k in mine)


def test_adapted_layer_grads_and_dropout_match_peft_formula():
    """The fused Wqkv with q and v adapters (scales 2 and 4): y, dx, dA, dB against PEFT's per-projection formula
    base(x) + B (A dropout(x)) * scale, with and without dropout (train mode)."""
    fe = fastenc.from_hf(_hf.bert("base"))
    fe.add_lora(r=4, lora_alpha=8, target_modules=["query"], adapter_name="a")
    fe.load_lora(_saved_value_adapter(), merge=False, adapter_name="b", is_trainable=True)  # same layer, idle
    layer = fe.layers[0].attn.Wqkv
    fe.set_adapter("a")
    _randomize_trainable(fe, seed=4)
    g = torch.Generator().manual_seed(5)
    for p_drop in (0.0, 0.3):
        layer.lora["a"].dropout = p_drop
        x = torch.randn(37, 64, generator=g, requires_grad=True)
        dy = torch.randn(37, 192, generator=g)
        fe.train()
        torch.manual_seed(11)
        y = layer(x)
        dx, da, db = torch.autograd.grad(y, (x, layer.lora["a"].lora_A["q"], layer.lora["a"].lora_B["q"]), dy)
        a = layer.lora["a"].lora_A["q"].detach().clone().requires_grad_(True)
        b = layer.lora["a"].lora_B["q"].detach().clone().requires_grad_(True)
        x2 = x.detach().clone().requires_grad_(True)
        torch.manual_seed(11)
        xd = fastenc.ops.dropout(x2, p_drop, backend="reference") if p_drop else x2
        ref = F.linear(x2, layer.weight, layer.bias)
        ref = ref + F.pad(F.linear(F.linear(xd, a), b) * 2.0, (0, 128))
        rdx, rda, rdb = torch.autograd.grad(ref, (x2, a, b), dy)
        for got, want in ((y, ref), (dx, rdx), (da, rda), (db, rdb)):
            testing.assert_close(got, want)
    fe.eval()


def test_each_adapted_projection_draws_its_own_dropout_mask():
    """query and value adapters on one fused Wqkv: as PEFT's separate layers, each reads its own dropout(x)
    (drawn in row order), not one mask shared by both."""
    fe = fastenc.from_hf(_hf.bert("base", layers=1))
    fe.add_lora(r=3, lora_alpha=6, target_modules=["query", "value"], lora_dropout=0.5)
    _randomize_trainable(fe, seed=6)
    layer, ad = fe.layers[0].attn.Wqkv, fe.layers[0].attn.Wqkv.lora["default"]
    x = torch.randn(29, 64, generator=torch.Generator().manual_seed(7), requires_grad=True)
    dy = torch.randn(29, 192, generator=torch.Generator().manual_seed(8))
    fe.train()
    torch.manual_seed(12)
    y = layer(x)
    got = torch.autograd.grad(y, (x, ad.lora_A["q"], ad.lora_B["v"]), dy)
    a_q, a_v, b_q, b_v = (t.detach().clone().requires_grad_(True) for t in
                          (ad.lora_A["q"], ad.lora_A["v"], ad.lora_B["q"], ad.lora_B["v"]))
    x2 = x.detach().clone().requires_grad_(True)
    torch.manual_seed(12)
    xq = fastenc.ops.dropout(x2, 0.5, backend="reference")
    xv = fastenc.ops.dropout(x2, 0.5, backend="reference")
    lora_q, lora_v = F.linear(F.linear(xq, a_q), b_q) * 2.0, F.linear(F.linear(xv, a_v), b_v) * 2.0
    ref = F.linear(x2, layer.weight, layer.bias) + torch.cat([lora_q, torch.zeros_like(lora_q), lora_v], -1)
    want = torch.autograd.grad(ref, (x2, a_q, b_v), dy)
    for g, w in zip((y, *got), (ref, *want)):
        testing.assert_close(g, w)
    fe.eval()


def _saved_value_adapter():
    """A value-only PEFT adapter folder for the small BERT (made by a second model's add_lora + save_lora)."""
    import tempfile

    other = fastenc.from_hf(_hf.bert("base"))
    other.add_lora(r=2, lora_alpha=8, target_modules=["value"])
    _randomize_trainable(other, seed=9)
    return other.save_lora(tempfile.mkdtemp())


def test_one_adapter_trains_at_a_time():
    fe = fastenc.from_hf(_hf.bert("base"))
    fe.add_lora(r=4, target_modules=["query"], adapter_name="a")
    fe.add_lora(r=4, target_modules=["key", "dense"], adapter_name="b")

    def training():
        return {n.split(".lora.")[1].split(".")[0] for n, p in fe.named_parameters() if p.requires_grad}
    assert training() == {"b"} and fe.lora_adapters["active"] == "b"
    fe.set_adapter("a")
    assert training() == {"a"}
    fe.set_adapter(None)
    assert training() == set()
    fe.remove_lora("a")
    fe.set_adapter("b")
    assert training() == {"b"} and fe.lora_adapters["unmerged"] == ["b"]


BAD = {
    "unknown-target": (dict(target_modules=["query", "qkv_proj"]), "target_modules \\['qkv_proj'\\] match no"),
    "r0": (dict(r=0), "r must be an int >= 1, got 0"),
    "alpha0": (dict(lora_alpha=0), "lora_alpha must be a number > 0, got 0"),
    "alpha-neg": (dict(lora_alpha=-2.0), "lora_alpha must be a number > 0"),
    "name-used": (dict(adapter_name="first"), "adapter_name 'first' is already used"),
    "dropout": (dict(lora_dropout=1.0), "lora_dropout must be a number in \\[0, 1\\)"),
    "save-missing": (dict(modules_to_save=["nothing"]), "modules_to_save \\['nothing'\\] match no"),
    "embedding": (dict(target_modules=["word_embeddings"]), "match no linear layer"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_add_lora_changes_nothing(case):
    fe = fastenc.from_hf(_hf.bert("base", layers=1))
    fe.add_lora(r=2, target_modules=["value"], adapter_name="first")
    snap, grads = snapshot(fe), {n: p.requires_grad for n, p in fe.named_parameters()}
    kw, msg = BAD[case]
    with pytest.raises(ValueError, match=msg):
        fe.add_lora(**{"r": 4, "target_modules": ["query"], **kw})
    assert same_state(fe, snap) and grads == {n: p.requires_grad for n, p in fe.named_parameters()}
    assert fe.lora_adapters["unmerged"] == ["first"]


def test_save_without_adapter_and_training_through_merged(tmp_path):
    fe = fastenc.from_hf(_hf.bert("base", layers=1))
    with pytest.raises(ValueError, match="save_lora: BertModel has no unmerged adapter"):
        fe.save_lora(tmp_path / "none")
    assert not (tmp_path / "none").exists()
    other = fastenc.from_hf(_hf.bert("base", layers=1))
    other.add_lora(r=2, target_modules=["query"])
    _randomize_trainable(other, seed=1)
    fe.load_lora(other.save_lora(tmp_path / "a"), merge=True)
    ids, mask, _ = _hf.text_batch([5, 3], seed=1)
    fe.train()
    with pytest.raises(RuntimeError, match=r"adapter\(s\) \['a'\] are merged into the weights"):
        fe(ids, mask)
    with pytest.raises(ValueError, match="is_trainable=True needs merge=False"):
        fe.load_lora(tmp_path / "a", is_trainable=True, adapter_name="again")
    fe.eval()
    with torch.no_grad():
        close(fe(ids, mask), other.eval()(ids, mask), mask)


@pytest.mark.parametrize("arch", list(TARGETS))
def test_default_targets_are_the_architecture_tables(arch):
    """add_lora() without target_modules takes the architecture's lora_targets (fastenc.models.architecture)."""
    from fastenc.lora import default_targets
    from fastenc.models import architecture

    fe = fastenc.from_hf(_hf_model(arch, "base"))
    declared = architecture.of_model(fe).lora_targets
    assert declared and default_targets(fe) == tuple(declared)
    fe.add_lora(r=4, lora_alpha=8)
    peft_names = {part[3] for m in fe.modules() if isinstance(m, LoraLinear)
                  for ad in m.lora.values() for part in ad.parts}
    assert peft_names and all(n.rpartition(".")[2] in declared for n in peft_names), sorted(peft_names)
