"""RoBERTa, XLM-RoBERTa and CamemBERT against transformers (eager attention, fp32, random weights): every head on mixed
lengths with padding, positions from the ids (pad ids inside a row, left padding), the position-table limit, the
masked-LM convention and its tied decoder, save/load both ways, and bf16 by the tolerance rule."""
from __future__ import annotations

import pytest
import torch

import fastenc
import _models_hf as _hf
from fastenc import testing

TOL = 1e-4
FAMILIES = {"roberta": _hf.roberta, "xlm-roberta": _hf.xlm_roberta, "camembert": _hf.camembert}
TASKS = ["base", "sequence_classification", "token_classification", "question_answering", "masked_lm"]


def _err(out, ref, mask=None):
    assert out.shape == ref.shape, (tuple(out.shape), tuple(ref.shape))
    assert torch.isfinite(out).all()
    if mask is not None:
        out, ref = out[mask.bool()], ref[mask.bool()]
    return float((out - ref).detach().abs().max())


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("task", TASKS)
def test_parity_every_head(family, task):
    hf = FAMILIES[family](task, hidden=48, heads=3)
    fe = fastenc.from_hf(hf)
    assert type(fe).__name__ == type(hf).__name__ and fe.task == task
    ids, mask = _hf.roberta_batch([17, 1, 129, 40], seed=3)
    types = torch.zeros_like(ids)
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=types)
    out = fe(ids, mask, types)
    if task == "base":
        assert _err(out, ref.last_hidden_state, mask) <= TOL
        assert _err(fe.pool(out, mask), ref.pooler_output) <= TOL
    elif task == "sequence_classification":
        assert fe.pooler is None and _err(out, ref.logits) <= TOL
    elif task == "question_answering":
        assert _err(out[0], ref.start_logits, mask) <= TOL and _err(out[1], ref.end_logits, mask) <= TOL
        assert float(out[0][~mask.bool()].abs().max()) == 0.0
    else:
        assert _err(out, ref.logits, mask) <= TOL
        assert float(out[~mask.bool()].abs().max()) == 0.0


def test_positions_follow_the_ids():
    # transformers counts non-pad ids: a pad id inside a row takes position padding_idx and does not advance the
    # count, and left padding does not shift the positions of the real tokens.
    hf = _hf.roberta("base")
    fe = fastenc.from_hf(hf)
    ids, mask = _hf.roberta_batch([30, 12, 25], seed=5)
    ids[0, 7] = ids[0, 20] = 1  # pad ids as real tokens
    left = torch.zeros_like(mask)
    left[1, -12:] = 1
    ids[1] = torch.cat([torch.ones(18, dtype=ids.dtype), ids[1, :12]])
    mask = torch.stack([mask[0], left[1], mask[2]])
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask).last_hidden_state
    assert _err(fe(ids, mask), ref, mask) <= TOL
    # the same rows with column positions (BERT's) differ: the check above can fail
    with torch.no_grad():
        shifted = hf(ids, attention_mask=mask, position_ids=torch.arange(30).expand(3, 30) + 2).last_hidden_state
    assert _err(shifted, ref, mask) > 1e-3


def test_position_table_limit():
    hf = _hf.roberta("base", layers=1)
    fe = fastenc.from_hf(hf)
    ok, mask = _hf.roberta_batch([158, 3], seed=1)  # positions 2..159: the last row of the 160-row table
    with torch.no_grad():
        ref = hf(ok, attention_mask=mask).last_hidden_state
    assert _err(fe(ok, mask), ref, mask) <= TOL
    long, mask = _hf.roberta_batch([159, 3], seed=1)
    with pytest.raises(ValueError, match=r"input_ids has a row of 159 tokens .* at most 158"):
        fe(long, mask)


def test_masked_lm_convention():
    hf = _hf.roberta("masked_lm")
    fe = fastenc.from_hf(hf)
    assert fe.decoder_weight is fe.embeddings.word.weight
    ids, mask = _hf.roberta_batch([20, 9, 33], seed=7)
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask).logits
    where = torch.zeros_like(mask, dtype=torch.bool)
    where[0, 3] = where[0, 11] = where[1, 8] = where[2, 30] = True
    by_mask = fe(ids, mask, positions=where)
    assert _err(by_mask, ref[where]) <= TOL
    pairs = where.nonzero()
    assert torch.equal(fe(ids, mask, positions=pairs), by_mask)
    # labels: loss and sparse logits at the labelled tokens, as transformers with -100 at padding
    labels = torch.full_like(ids, -100)
    labels[where] = ids[where]
    out = fe(ids, mask, labels=labels)
    with torch.no_grad():
        ref_out = hf(ids, attention_mask=mask, labels=labels)
    assert _err(out.logits, ref[where]) <= TOL
    assert abs(float(out.loss.detach()) - float(ref_out.loss)) <= TOL
    with pytest.raises(ValueError, match="positions must be real tokens"):
        fe(ids, mask, positions=torch.tensor([[1, 12]]))
    with pytest.raises(ValueError, match=r"labels must be class indices in \[0, 211\)"):
        fe(ids, mask, labels=labels.masked_fill(where, 211))


def test_head_losses():
    ids, mask = _hf.roberta_batch([20, 20, 20], seed=9)  # unpadded: padded logits would enter the QA softmax
    qa = _hf.roberta("question_answering")
    start, end = torch.tensor([3, 0, 25]), torch.tensor([5, 19, 30])
    with torch.no_grad():
        ref = qa(ids, attention_mask=mask, start_positions=start, end_positions=end)
    out = fastenc.from_hf(qa)(ids, mask, start_positions=start, end_positions=end)
    assert abs(float(out.loss.detach()) - float(ref.loss.detach())) <= TOL and _err(out.start_logits, ref.start_logits) <= TOL
    cls = _hf.roberta("sequence_classification")
    labels = torch.tensor([4, 0, 2])
    with torch.no_grad():
        ref = cls(ids, attention_mask=mask, labels=labels)
    out = fastenc.from_hf(cls)(ids, mask, labels=labels)
    assert abs(float(out.loss.detach()) - float(ref.loss.detach())) <= TOL
    with pytest.raises(ValueError, match="start_positions and end_positions must be given together"):
        fastenc.from_hf(qa)(ids, mask, start_positions=start)


@pytest.mark.parametrize("family", FAMILIES)
def test_save_and_load_both_ways(tmp_path, family):
    hf = FAMILIES[family]("masked_lm", layers=1)
    hf.save_pretrained(tmp_path / "hf")
    fe = fastenc.from_pretrained(tmp_path / "hf")
    assert type(fe).__name__ == type(hf).__name__ and fe.decoder_weight is fe.embeddings.word.weight
    fe.save_pretrained(tmp_path / "fe")
    back = type(hf).from_pretrained(tmp_path / "fe", attn_implementation="eager").eval()
    assert back.lm_head.decoder.weight is back.roberta.embeddings.word_embeddings.weight
    for k, v in hf.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    ids, mask = _hf.roberta_batch([12, 5], seed=2)
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask).logits
    assert _err(fe(ids, mask), ref, mask) <= TOL


def test_bad_config():
    from fastenc.models.roberta import RobertaConfig, RobertaForQuestionAnswering

    with pytest.raises(ValueError, match="num_labels must be 2"):
        RobertaForQuestionAnswering(RobertaConfig(hidden_size=16, num_attention_heads=2, num_hidden_layers=1,
                                                  intermediate_size=20, vocab_size=50, num_labels=3))


@pytest.mark.parametrize("dtype", [torch.bfloat16], ids=["bf16"])
def test_low_precision(dtype):
    hf = _hf.roberta("masked_lm", hidden=64, heads=4)
    ids, mask = _hf.roberta_batch([17, 5, 40], seed=21)
    with torch.no_grad():
        ref32 = hf(ids, attention_mask=mask).logits
        ref_lowp = _hf.roberta("masked_lm", hidden=64, heads=4).to(dtype)(ids, attention_mask=mask).logits
    out = fastenc.from_hf(hf).to(dtype=dtype)(ids, mask)
    assert out.dtype == dtype
    m = mask.bool()
    testing.assert_close(out[m].float(), ref32[m], ref_lowp[m].float(), dtype=dtype)


@pytest.mark.parametrize("task", ["sequence_classification", "token_classification", "question_answering",
                                  "masked_lm"])
def test_first_step_gradients(task):
    # train mode, dropout off: the heads' losses and every parameter's gradient as transformers' (through the
    # inverse map; the masked-LM word embedding collects its decoder gradient too). Question answering unpadded
    # (transformers' padded logits would enter its softmax).
    from fastenc.models import architecture, convert

    hf = _hf.roberta(task, hidden=48, heads=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).train()
    fe = fastenc.from_hf(hf).train()
    lengths = [21, 21, 21] if task == "question_answering" else [21, 6, 1]
    ids, mask = _hf.roberta_batch(lengths, seed=12)
    g = torch.Generator().manual_seed(12)
    if task == "sequence_classification":
        labels = {"labels": torch.randint(0, 5, (3,), generator=g)}
    elif task == "question_answering":
        labels = {"start_positions": torch.tensor([2, 9, 0]), "end_positions": torch.tensor([4, 9, 20])}
    else:
        n = 5 if task == "token_classification" else 211
        lab = torch.randint(0, n, ids.shape, generator=g).masked_fill(mask == 0, -100)
        labels = {"labels": lab.masked_fill(torch.rand(ids.shape, generator=g) < 0.5, -100)}
    ref = hf(input_ids=ids, attention_mask=mask, **labels).loss
    out = fe(ids, mask, **labels).loss
    ref.backward()
    out.backward()
    assert abs(float(out.detach()) - float(ref.detach())) <= 1e-5
    entries = architecture.of_model(fe).entries(fe.config, fe.task)
    grads = convert.fastenc_to_hf(entries, {n: p.grad for n, p in fe.named_parameters()}, fe.config)
    want = {n: p.grad for n, p in hf.named_parameters(remove_duplicate=False)}
    assert all(p.grad is not None for p in fe.parameters())
    assert set(grads) == set(want) - set(getattr(hf, "_tied_weights_keys", None) or {})
    scale = max(float(t.abs().max()) for t in want.values() if t is not None)
    for name, got in grads.items():
        # floor 1e-2 of the largest gradient: a gradient that is zero in theory (the QA head's bias: the softmax over
        # positions minus the one-hot, summed) is fp32 rounding noise on both sides, ~1e-7 here
        assert _err(got, want[name]) <= 1e-4 * max(float(want[name].abs().max()), 1e-2 * scale), name


def test_positions_on_packed_tokens_as_transformers():
    # the packed path (right padding, no padding) and the grid path (left padding and holes whose padded columns
    # hold ids other than pad, which transformers counts) against transformers' position ids at the real tokens
    from transformers.models.roberta.modeling_roberta import RobertaEmbeddings
    from fastenc.models.base import pack_text

    fe = fastenc.from_hf(_hf.roberta("base", layers=1))
    ids, mask = _hf.roberta_batch([30, 12, 25], seed=5)
    ids[0, 7] = ids[0, 20] = ids[2, 0] = 1  # pad ids as real tokens
    left = mask.flip(1)
    holes = mask.clone()
    holes[0, 3:6] = 0
    for m, pad_ids in ((mask, True), (torch.ones_like(mask), True), (left, False), (holes, False)):
        x = ids.masked_fill(~m.bool(), 1) if pad_ids else ids.masked_fill(~m.bool(), 7)
        batch, packed, pos = pack_text(x, m.bool())
        at, _ = fe._positions(x, batch, packed, pos, None, None)
        ref = RobertaEmbeddings.create_position_ids_from_input_ids(x, padding_idx=1)
        assert torch.equal(at, ref[m.bool()])
