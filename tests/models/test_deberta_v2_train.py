"""DeBERTa-v2/v3 training against transformers (fp32, random weights, dropout off unless stated): 20 AdamW steps of
v3 sequence classification (equal loss at every step, equal weights after); first-step gradients of every head in the
v2 shape (pos_key_proj / pos_query_proj, clamped distances, embedding_size 40); gradients through accelerate; dropout
in training; LoRA on PEFT's default targets trained, saved and read back by PEFT; save_pretrained after training."""
from __future__ import annotations

import warnings

import pytest
import torch

import fastenc
import _models_hf as _hf
from fastenc.models import architecture, convert
from fastenc.models.hf import FallbackWarning

NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
V2 = dict(share_att_key=False, pos_att_type=["c2p", "p2c"], position_buckets=-1, max_relative_positions=16,
          position_biased_input=True, type_vocab_size=2, norm_rel_ebd="none", embedding_size=40)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max()) / max(float(b.abs().max()), 1e-6)


def _batch(step: int, g: torch.Generator, n: int = 3):
    """Right-padded rows of random lengths (up to 24: past the exact distances of the 8 log buckets), one with a
    hole."""
    lengths = torch.randint(1, 25, (n,), generator=g).tolist()
    ids, mask, types = _hf.text_batch(lengths, seed=step)
    if lengths[0] > 3:
        mask[0, 2] = 0
    return ids * mask, mask, types * mask


def _hf_grads(fe, grads: dict) -> dict:
    entries = architecture.of_model(fe).entries(fe.config, fe.task)
    return convert.fastenc_to_hf(entries, grads, fe.config)


def test_twenty_adamw_steps_of_v3_sequence_classification_match_transformers():
    hf = _hf.deberta_v2("sequence_classification", **NO_DROPOUT).train()
    fe = fastenc.from_hf(hf).train()
    opt_hf = torch.optim.AdamW(hf.parameters(), lr=2e-3)
    opt_fe = torch.optim.AdamW(fe.parameters(), lr=2e-3)
    g = torch.Generator().manual_seed(0)
    for step in range(20):
        ids, mask, _ = _batch(step, g)
        labels = torch.randint(0, 5, (3,), generator=g)
        for opt in (opt_hf, opt_fe):
            opt.zero_grad(set_to_none=True)
        ref = hf(input_ids=ids, attention_mask=mask, labels=labels).loss
        out = fe(ids, mask, labels=labels).loss
        ref.backward()
        out.backward()
        out, ref = out.detach(), ref.detach()
        assert abs(float(out) - float(ref)) <= 1e-4 * abs(float(ref)), (step, float(out), float(ref.detach()))
        opt_hf.step()
        opt_fe.step()
    mine = _hf_grads(fe, {k: v.detach() for k, v in fe.state_dict().items()})
    theirs = dict(hf.named_parameters())
    moved = 0
    for name, t in mine.items():
        assert _rel(t, theirs[name].detach()) <= 1e-3, (name, _rel(t, theirs[name].detach()))
        moved += 1
    assert moved == len(theirs)


@pytest.mark.parametrize("task", ["sequence_classification", "token_classification", "question_answering",
                                  "masked_lm", "multiple_choice"])
def test_first_step_gradients_of_every_head(task):
    hf = _hf.deberta_v2(task, **V2, **NO_DROPOUT).train()
    fe = fastenc.from_hf(hf).train()
    g = torch.Generator().manual_seed(12)
    ids, mask, types = _batch(12, g)
    if task == "multiple_choice":
        ids, mask, types = ids[None], mask[None], types[None]  # one question, three choices
        labels = {"labels": torch.tensor([1])}
    elif task == "sequence_classification":
        labels = {"labels": torch.randint(0, 5, (3,), generator=g)}
    elif task == "question_answering":
        labels = {"start_positions": torch.tensor([0, 1, 2]), "end_positions": torch.tensor([3, 0, 45])}
    else:
        n = 5 if task == "token_classification" else 211
        lab = torch.randint(0, n, ids.shape, generator=g).masked_fill(mask == 0, -100)
        labels = {"labels": lab.masked_fill(torch.rand(ids.shape, generator=g) < 0.5, -100)}
    ref = hf(input_ids=ids, attention_mask=mask, token_type_ids=types, **labels).loss
    out = fe(ids, mask, types, **labels).loss
    ref.backward()
    out.backward()
    out, ref = out.detach(), ref.detach()
    assert abs(float(out) - float(ref)) <= 1e-5 * max(1.0, abs(float(ref)))
    grads = _hf_grads(fe, {n: p.grad for n, p in fe.named_parameters()})
    want = {n: p.grad for n, p in hf.named_parameters()}
    assert set(grads) == set(want)
    scale = max(float(t.abs().max()) for t in want.values() if t is not None)
    for name, got in grads.items():
        if want[name] is None:  # (no path to the loss in transformers either)
            assert got is None or not got.any(), name
            continue
        err = float((got - want[name]).abs().max())
        assert err <= 1e-4 * max(float(want[name].abs().max()), 1e-2 * scale), (name, err)
    assert float(fe.layers[0].attn.pos_key.weight.grad.abs().max()) > 0
    assert float(fe.rel.weight.grad.abs().max()) > 0


def test_accelerate_training_gradients_reach_transformers_parameters():
    hf, twin = (_hf.deberta_v2("sequence_classification", **NO_DROPOUT) for _ in range(2))
    acc = fastenc.accelerate(twin.train())
    hf.train()
    ids, mask, _ = _batch(14, torch.Generator().manual_seed(14))
    mask[1] = mask[1].flip(0)  # left padding: column 0 is the row's padded state, as transformers reads it
    ids = ids * mask
    labels = torch.tensor([0, 3, 1])
    ref = hf(input_ids=ids, attention_mask=mask, labels=labels)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        out, fast = _hf.ran_fastenc(lambda: acc(input_ids=ids, attention_mask=mask, labels=labels))
    assert fast and abs(float(out.loss) - float(ref.loss)) <= 1e-4
    ref.loss.backward()
    out.loss.backward()
    mine = dict(twin.named_parameters())
    for name, p in hf.named_parameters():
        assert mine[name].grad is not None, name
        assert float((mine[name].grad - p.grad).abs().max()) <= 1e-4 * max(float(p.grad.abs().max()), 1e-2), name


def test_dropout_in_training():
    # transformers' dropouts are on in train mode (the relative embeddings' too), off in eval mode
    fe = fastenc.from_hf(_hf.deberta_v2("sequence_classification", hidden_dropout_prob=0.3,
                                        attention_probs_dropout_prob=0.2))
    ids, mask, _ = _batch(3, torch.Generator().manual_seed(3))
    labels = torch.tensor([1, 2, 3])
    fe.train()
    a, b = fe(ids, mask, labels=labels), fe(ids, mask, labels=labels)
    assert torch.isfinite(a.loss) and not torch.equal(a.logits, b.logits)
    a.loss.backward()
    assert float(fe.rel.weight.grad.abs().max()) > 0
    fe.eval()
    with torch.no_grad():
        assert torch.equal(fe(ids, mask), fe(ids, mask))


def test_lora_training_saves_an_adapter_peft_reads_and_a_checkpoint_transformers_reads(tmp_path):
    from peft import PeftModel

    hf = _hf.deberta_v2("sequence_classification", **NO_DROPOUT)
    fe = fastenc.from_hf(hf).train()
    torch.manual_seed(0)
    fe.add_lora(r=4, lora_alpha=8, target_modules=list(architecture.get("deberta-v2").lora_targets),
                lora_dropout=0.0)
    params = [p for p in fe.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-2)
    g = torch.Generator().manual_seed(4)
    for step in range(4):
        ids, mask, _ = _batch(step, g)
        opt.zero_grad()
        fe(ids, mask, labels=torch.randint(0, 5, (3,), generator=g)).loss.backward()
        opt.step()
    fe.eval()
    fe.save_lora(tmp_path / "adapter")
    ids, mask, _ = _batch(9, g)
    with torch.no_grad():
        base = hf(input_ids=ids, attention_mask=mask).logits
        pm = PeftModel.from_pretrained(hf, tmp_path / "adapter").eval()  # (adapts hf in place)
        out = fe(ids, mask)
        ref = pm(input_ids=ids, attention_mask=mask).logits
    assert float((ref - base).abs().max()) > 1e-4  # the adapter trained
    assert float((out - ref).abs().max()) <= 1e-4
    fe.merge_and_unload().save_pretrained(tmp_path / "merged")
    back = _hf.transformers.DebertaV2ForSequenceClassification.from_pretrained(tmp_path / "merged",
                                                                              attn_implementation="eager").eval()
    with torch.no_grad():
        assert float((back(input_ids=ids, attention_mask=mask).logits - ref).abs().max()) <= 1e-4
