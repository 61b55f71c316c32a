"""Bad adapters raise a clear error and leave the model exactly as it was (never half-merged)."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import fastenc
import _models_hf as _hf
from _peft_helpers import peft_model, same_state, snapshot
from fastenc.lora import LoraLinear


@pytest.fixture(scope="module")
def bert_adapter(tmp_path_factory):
    hf = _hf.bert("base")
    folder = tmp_path_factory.mktemp("adapter")
    peft_model(hf, r=8, lora_alpha=16, target_modules=["query", "value", "dense"]).save_pretrained(folder)
    return hf, folder


def _edit(src, dst, config=None, state=None):
    cfg = json.loads((src / "adapter_config.json").read_text())
    st = load_file(str(src / "adapter_model.safetensors"))
    if config:
        config(cfg)
    if state:
        st = state(st)
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "adapter_config.json").write_text(json.dumps(cfg))
    save_file(st, str(dst / "adapter_model.safetensors"))
    return dst


def _last_key(st, part):
    return sorted(k for k in st if part in k)[-1]  # a late module: earlier ones are valid (no half merge)


def _shrink_b(st):
    k = _last_key(st, "lora_B")
    st[k] = st[k][:, :4].contiguous()
    return st


def _wide_a(st):
    k = _last_key(st, "lora_A")
    st[k] = torch.randn(st[k].shape[0], st[k].shape[1] + 8)
    return st


def _rename_last(st):
    k = _last_key(st, "lora_A")
    kb = k.replace("lora_A", "lora_B")
    st[k.replace("dense", "densse")] = st.pop(k)
    st[kb.replace("dense", "densse")] = st.pop(kb)
    return st


CASES = {
    "rank-mismatch": (None, _shrink_b, "rank mismatch between lora_A"),
    "hidden-size": (None, _wide_a, "another hidden size"),
    "missing-target": (None, _rename_last, "do not exist"),
    "alpha-zero": (lambda c: c.update(lora_alpha=0), None, "lora_alpha must be a number > 0"),
    "alpha-negative": (lambda c: c.update(lora_alpha=-4), None, "lora_alpha must be a number > 0"),
    "dora": (lambda c: c.update(use_dora=True), None, "DoRA"),
    "fan-in-fan-out": (lambda c: c.update(fan_in_fan_out=True), None, "fan_in_fan_out"),
    "bias-all": (lambda c: c.update(bias="all"), None, "bias must be 'none'"),
}


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
@pytest.mark.parametrize("case", list(CASES))
def test_bad_adapter_leaves_model_untouched(bert_adapter, tmp_path, case, merge):
    hf, folder = bert_adapter
    config, state, match = CASES[case]
    bad = _edit(folder, tmp_path / case, config, state)
    fe = fastenc.from_hf(hf)
    snap = snapshot(fe)
    with pytest.raises(ValueError, match=match):
        fe.load_lora(bad, merge=merge)
    assert same_state(fe, snap)
    assert fe.lora_adapters == {"merged": [], "unmerged": [], "active": None}
    assert not any(isinstance(m, LoraLinear) for m in fe.modules())


def test_adapter_for_another_architecture(tmp_path):
    mb = _hf.modernbert("base")
    peft_model(mb, r=4, lora_alpha=8, target_modules=["Wqkv"]).save_pretrained(tmp_path)
    fe = fastenc.from_hf(_hf.bert("base"))
    snap = snapshot(fe)
    with pytest.raises(ValueError, match="another architecture"):
        fe.load_lora(tmp_path)
    assert same_state(fe, snap)


def test_dora_peft_model_and_conv_target():
    hf = _hf.bert("base")
    fe = fastenc.from_hf(hf)
    with pytest.raises(ValueError, match="DoRA"):
        fe.load_lora(peft_model(hf, r=4, lora_alpha=8, use_dora=True, target_modules=["query"]))
    vit = _hf.vit("base", image=64)
    fv = fastenc.from_hf(vit)
    snap = snapshot(fv)
    with pytest.raises(ValueError, match="not a linear layer"):
        fv.load_lora(peft_model(vit, r=4, lora_alpha=8, target_modules=["projection", "q_proj"]))
    assert same_state(fv, snap)


def test_bad_arguments(bert_adapter, tmp_path):
    hf, folder = bert_adapter
    fe = fastenc.from_hf(hf)
    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        fe.load_lora(tmp_path)
    with pytest.raises(TypeError, match="source must be a PEFT adapter folder"):
        fe.load_lora(42)
    with pytest.raises(TypeError, match="merge must be a bool"):
        fe.load_lora(folder, merge="yes")
    fe.load_lora(folder, merge=False, adapter_name="x")
    with pytest.raises(ValueError, match="already loaded"):
        fe.load_lora(folder, adapter_name="x")
    with pytest.raises(ValueError, match="no unmerged adapter"):
        fe.remove_lora("y")


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
def test_safe_merge_refuses_non_finite_adapter(bert_adapter, tmp_path, merge):
    hf, folder = bert_adapter

    def nan_b(st):
        k = _last_key(st, "lora_B")
        st[k] = st[k].clone()
        st[k][0, 0] = float("nan")
        return st

    bad = _edit(folder, tmp_path / "nan", None, nan_b)
    fe = fastenc.from_hf(hf)
    snap = snapshot(fe)
    with pytest.raises(ValueError, match=r"safe_merge: adapter 'nan' produces non-finite \(NaN/inf\) weights in "
                                         r"\['pooler\."):
        fe.load_lora(bad, merge=merge, safe_merge=True)
    assert same_state(fe, snap)  # bit-identical
    assert fe.lora_adapters == {"merged": [], "unmerged": [], "active": None}
    assert not any(isinstance(m, LoraLinear) for m in fe.modules())
    fe.load_lora(folder, merge=merge, safe_merge=True)  # a finite adapter passes the check
    assert not same_state(fe, snap) if merge else fe.lora_adapters["unmerged"] == [folder.name]
    with pytest.raises(TypeError, match="safe_merge must be a bool"):
        fe.load_lora(folder, adapter_name="z", safe_merge=1)


def test_corrupt_adapter_files_are_named(bert_adapter, tmp_path):
    hf, folder = bert_adapter
    fe = fastenc.from_hf(hf)
    snap = snapshot(fe)
    cfg_bad = _edit(folder, tmp_path / "cfg")
    (cfg_bad / "adapter_config.json").write_text("{\"r\": 8,")
    with pytest.raises(ValueError, match=r"cfg/adapter_config.json is not valid JSON"):
        fe.load_lora(cfg_bad)
    (cfg_bad / "adapter_config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"cfg/adapter_config.json must hold a JSON object, got a list"):
        fe.load_lora(cfg_bad)
    st_bad = _edit(folder, tmp_path / "st")
    data = (st_bad / "adapter_model.safetensors").read_bytes()
    (st_bad / "adapter_model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"cannot read .*st/adapter_model.safetensors"):
        fe.load_lora(st_bad)
    (st_bad / "adapter_model.safetensors").write_bytes(b"\x00" * 5)
    with pytest.raises(ValueError, match=r"cannot read .*st/adapter_model.safetensors"):
        fe.load_lora(st_bad)
    assert same_state(fe, snap)
