"""The CLIP text tower against transformers (eager attention, random weights, hidden 36, 3 heads, MLP width 65,
vocabulary 211, 40 positions): CLIPTextModel and CLIPTextModelWithProjection with right and left padding, both
EOS rules of transformers 5 (first eos_token_id; the largest id when eos_token_id == 2), causal attention (a later
token never changes an earlier one), gradients in training, accelerate, save_pretrained / from_pretrained both
ways, PEFT LoRA (unmerged), bad input."""
from __future__ import annotations

import json

import pytest
import torch

import fastenc
import _models_hf as _hf

EOS = 210
TASKS = ["base", "text_embedding"]


def _batch(lengths, seq=None, left=False, seed=0, eos=EOS, pad=EOS):
    """ids (batch, seq): random tokens in [3, 200), each real sequence ending with `eos`, padded with `pad`;
    mask (batch, seq) long."""
    g = torch.Generator().manual_seed(seed)
    seq = seq or max(lengths)
    ids = torch.full((len(lengths), seq), pad, dtype=torch.long)
    mask = torch.zeros(len(lengths), seq, dtype=torch.long)
    for i, n in enumerate(lengths):
        row = torch.randint(3, 200, (n,), generator=g)
        row[-1] = eos
        sl = slice(seq - n, seq) if left else slice(0, n)
        ids[i, sl], mask[i, sl] = row, 1
    return ids, mask


def _close(out, ref, tol=1e-4):
    assert out.shape == ref.shape, (tuple(out.shape), tuple(ref.shape))
    assert torch.isfinite(out).all()
    err = float((out - ref).detach().abs().max())
    assert err <= tol, f"max abs error {err:.3e} > {tol:.0e}"


def _real(hidden, mask):
    return hidden[mask.bool()]


@pytest.mark.parametrize("left", [False, True], ids=["right", "left"])
@pytest.mark.parametrize("task", TASKS)
def test_parity_fp32(task, left):
    hf = _hf.clip_text_model(task, seed=1)
    fe = fastenc.from_hf(hf)
    assert type(fe).__name__ == type(hf).__name__
    # (left padding with the EOS id would put the first EOS, the pooled token, on padding: pad id 1 there)
    ids, mask = _batch([7, 1, 17, 12], seq=19, left=left, seed=2, pad=1 if left else EOS)
    with torch.no_grad():
        ref, out = hf(ids, attention_mask=mask), fe.hf_forward(ids, mask)
    _close(_real(out["last_hidden_state"], mask), _real(ref.last_hidden_state, mask))
    assert float(out["last_hidden_state"][~mask.bool()].abs().max()) == 0.0  # (padding: zeros)
    key = "pooler_output" if task == "base" else "text_embeds"
    _close(out[key], getattr(ref, key))
    if task == "text_embedding":
        with torch.no_grad():
            _close(fe(ids, mask), ref.text_embeds)
        assert ref.text_embeds.shape == (4, 20)


def test_legacy_eos_rule_and_no_mask():
    # eos_token_id == 2: transformers pools the column of each row's largest id (here 210 ends each row)
    hf = _hf.clip_text_model(seed=3, eos_token_id=2)
    fe = fastenc.from_hf(hf)
    ids, _ = _batch([13, 13, 13], seed=4)
    ids[1, 5] = EOS  # a second 210: argmax takes the first
    with torch.no_grad():
        ref, out = hf(ids), fe.hf_forward(ids)
    _close(out["last_hidden_state"], ref.last_hidden_state)
    _close(out["pooler_output"], ref.pooler_output)
    _close(out["pooler_output"][1], out["last_hidden_state"][1, 5])


def test_attention_is_causal():
    fe = fastenc.from_hf(_hf.clip_text_model(seed=5))
    ids, _ = _batch([11], seed=6)
    other = ids.clone()
    other[0, 8:] = torch.tensor([5, 6, EOS])
    with torch.no_grad():
        a, b = fe(ids), fe(other)
    _close(a[:, :8], b[:, :8], 1e-6)
    assert float((a[:, 8:] - b[:, 8:]).abs().max()) > 1e-3


@pytest.mark.parametrize("task", TASKS)
def test_training_gradients_match_transformers(task):
    hf = _hf.clip_text_model(task, seed=7).train()
    fe = fastenc.from_hf(hf).train()
    ids, mask = _batch([9, 4, 15], seed=8)
    key = "pooler_output" if task == "base" else "text_embeds"
    ref, out = getattr(hf(ids, attention_mask=mask), key), fe.hf_forward(ids, mask)[key]
    target = torch.randn(ref.shape, generator=torch.Generator().manual_seed(9))
    ((ref - target) ** 2).sum().backward()
    ((out - target) ** 2).sum().backward()
    enc = hf if task == "base" else hf.text_model
    mine = dict(fe.named_parameters())
    pairs = {"embeddings.word.weight": enc.embeddings.token_embedding.weight,
             "embeddings.position.weight": enc.embeddings.position_embedding.weight,
             "layers.0.attn.Wo.weight": enc.encoder.layers[0].self_attn.out_proj.weight,
             "layers.1.mlp.fc1.bias": enc.encoder.layers[1].mlp.fc1.bias,
             "norm.weight": enc.final_layer_norm.weight}
    if task == "text_embedding":
        pairs["text_projection.weight"] = hf.text_projection.weight
    for name, t in pairs.items():
        _close(mine[name].grad, t.grad, 1e-5 * max(1.0, float(t.grad.abs().max())))


@pytest.mark.parametrize("task", TASKS)
def test_accelerate_same_outputs(task):
    hf = _hf.clip_text_model(task, seed=10)
    fast = fastenc.accelerate(hf)
    ids, mask = _batch([6, 14, 3], seed=11)
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask)
        out, ran = _hf.ran_fastenc(lambda: fast(ids, attention_mask=mask))
    assert ran and type(out) is type(ref) and type(fast).__name__ == type(hf).__name__
    _close(_real(out.last_hidden_state, mask), _real(ref.last_hidden_state, mask))
    key = "pooler_output" if task == "base" else "text_embeds"
    _close(getattr(out, key), getattr(ref, key))


@pytest.mark.parametrize("task", TASKS)
def test_from_pretrained_and_save_pretrained(tmp_path, task):
    hf = _hf.clip_text_model(task, seed=12)
    hf.save_pretrained(tmp_path / "hf")
    fe = fastenc.from_pretrained(tmp_path / "hf")
    assert type(fe).__name__ == type(hf).__name__ and fe.task == task
    ids, mask = _batch([5, 10], seed=13)
    key = "pooler_output" if task == "base" else "text_embeds"
    with torch.no_grad():
        _close(fe.hf_forward(ids, mask)[key], getattr(hf(ids, attention_mask=mask), key))
    fe.save_pretrained(tmp_path / "fe")
    cls = getattr(_hf.transformers, type(hf).__name__)
    back = cls.from_pretrained(tmp_path / "fe", attn_implementation="eager").eval()
    assert set(back.state_dict()) == set(hf.state_dict())
    for k, v in hf.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    config = json.loads((tmp_path / "fe" / "config.json").read_text())
    assert config["model_type"] == "clip_text_model" and config["eos_token_id"] == EOS
    assert "attention_probs_dropout_prob" not in config and config["attention_dropout"] == 0.0


def test_bad_input():
    fe = fastenc.from_hf(_hf.clip_text_model("text_embedding"))
    ids, mask = _batch([6, 4], seed=14)
    ids[1, 3] = 7  # row 1: no EOS among its real tokens, EOS only in its padding
    with pytest.raises(ValueError, match=r"pooled \(EOS\) token of input_ids rows \[1\] lies on a padded position"):
        fe(ids, mask)
    with pytest.raises(ValueError, match=r"input_ids must be in \[0, 211\)"):
        fe(torch.full((1, 3), 211))
    with pytest.raises(TypeError, match="input_ids must be an integer tensor"):
        fe(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="token_type_ids must be None"):
        fe(ids, None, torch.zeros_like(ids))


def test_peft_lora_adapter(tmp_path):
    from peft import LoraConfig, get_peft_model

    peft = get_peft_model(_hf.clip_text_model("text_embedding", seed=15),
                          LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "fc1"]))
    g = torch.Generator().manual_seed(16)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    peft.save_pretrained(tmp_path)
    fe = fastenc.from_hf(_hf.clip_text_model("text_embedding", seed=15))
    ids, mask = _batch([8, 13], seed=17)
    with torch.no_grad():
        plain = fe(ids, mask)
        fe.load_lora(tmp_path, merge=False)
        ref, out = peft(ids, attention_mask=mask).text_embeds, fe(ids, mask)
    assert float((out - plain).abs().max()) > 1e-3
    _close(out, ref)
