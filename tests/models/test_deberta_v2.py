"""DeBERTa-v2/v3 against transformers (eager, fp32, random weights, hidden 48, 4 heads): every head on mixed lengths
with right padding, a mask with a hole and left padding, in the v3 shape (no absolute positions, LayerNorm-ed
relative embeddings, share_att_key, p2c + c2p, 8 log buckets up to distance 24, no token types) and the v2 shape
(absolute positions, pos_key_proj / pos_query_proj, no buckets, distances clamped at 16, token types,
embedding_size 40 != hidden); the slots trimmed to the batch's reach; bf16 by the tolerance rule; DeBERTa's own
sequence loss; the question-answering loss over padded columns; multiple choice; save_pretrained both ways;
accelerate; PEFT adapters; configs refused by name. Training: test_deberta_v2_train.py."""
from __future__ import annotations

import json
import warnings

import pytest
import torch

import fastenc
import _models_hf as _hf
from fastenc import testing
from fastenc.models.hf import FallbackWarning

TOL = 1e-4
TASKS = ["base", "sequence_classification", "token_classification", "question_answering", "masked_lm"]
V2 = dict(share_att_key=False, pos_att_type=["c2p", "p2c"], position_buckets=-1, max_relative_positions=16,
          position_biased_input=True, type_vocab_size=2, norm_rel_ebd="none", embedding_size=40)
VARIANTS = {"v3": {}, "v2": V2, "c2p-only": dict(pos_att_type=["c2p"], share_att_key=False),
            "absolute-only": dict(relative_attention=False, position_biased_input=True)}


def _batch(seed=5, lengths=(17, 1, 29, 40), left=True):
    """Mixed lengths (1 among them), right padding, row 0 with a hole, row 3 left-padded (left=True)."""
    ids, mask, types = _hf.text_batch(list(lengths), seq=43, seed=seed)
    mask[0, 6] = 0
    if left:
        mask[3] = mask[3].roll(3)
    return ids * mask, mask, types * mask


def _close(out, ref, mask=None, tol=TOL):
    assert out.shape == ref.shape, (tuple(out.shape), tuple(ref.shape))
    out = out.detach()
    assert torch.isfinite(out).all()
    if mask is not None:
        out, ref = out[mask.bool()], ref[mask.bool()]
    err = float((out - ref).abs().max())
    assert err <= tol, f"max abs error {err:.3e} > {tol:.0e}"


def _check(task, out, ref, mask):
    if task == "base":
        _close(out, ref.last_hidden_state, mask)
    elif task == "question_answering":
        _close(out[0], ref.start_logits, mask)
        _close(out[1], ref.end_logits, mask)
        assert float(out[0][~mask.bool()].abs().max()) == 0  # zeros at padding
    elif task == "sequence_classification":
        _close(out[:3], ref.logits[:3])  # (row 3 is left-padded: fastenc pools its first real token)
    else:
        _close(out, ref.logits, mask)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("task", TASKS)
def test_parity_every_head(task, variant):
    if variant in ("c2p-only", "absolute-only") and task not in ("base", "masked_lm"):
        pytest.skip("the attention variants are covered on the encoder")
    hf = _hf.deberta_v2(task, **VARIANTS[variant])
    fe = fastenc.from_hf(hf)
    assert type(fe).__name__ == type(hf).__name__ and fe.task == task
    ids, mask, types = _batch()
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=types)
        _check(task, fe(ids, mask, types), ref, mask)


def test_v2_shape_reaches_the_clamped_distances_and_v3_the_log_buckets():
    from fastenc.models.deberta_v2_encoder import reach

    v3 = fastenc.from_hf(_hf.deberta_v2()).config
    v2 = fastenc.from_hf(_hf.deberta_v2(**V2)).config
    assert (v3.rel_span, v3.max_relative, v2.rel_span) == (8, 24, 16)
    assert reach(v3, 43) == 8 and reach(v3, 5) == 5 and reach(v3, 1) == 1   # distance 4 = bucket 4 (< 8 // 2)
    assert reach(v2, 43) == 16 and reach(v2, 9) == 9


def test_trimmed_slots_match_the_full_span(monkeypatch):
    # a short batch projects only the slots it can reach; the output is the full span's
    from fastenc.models import deberta_v2_encoder as enc

    hf = _hf.deberta_v2("base", **{**V2, "max_relative_positions": 40})
    fe = fastenc.from_hf(hf)
    ids, mask, types = _batch(seed=7, lengths=(9, 4, 11, 2))
    ids, mask, types = ids[:, :12], mask[:, :12], types[:, :12]
    assert enc.reach(fe.config, 12) == 12
    with torch.no_grad():
        short = fe(ids, mask, types)
        monkeypatch.setattr(enc, "reach", lambda cfg, width: cfg.rel_span)
        full = fe(ids, mask, types)
        ref = hf(ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    _close(short, full, mask, tol=1e-5)
    _close(short, ref, mask)


def test_head_group_keeps_the_products_within_qkv():
    from fastenc.models.deberta_v2_encoder import GROUP_FROM_BYTES, head_group

    big = 1 << 20  # tokens: products far past GROUP_FROM_BYTES
    for heads, d, slots, terms in [(12, 64, 512, 2), (12, 64, 256, 2), (12, 64, 256, 1), (4, 12, 16, 2), (3, 8, 999, 2)]:
        g = head_group(heads, d, slots, terms, big)
        assert 1 <= g <= heads
        assert g == 1 or g * terms * slots <= 3 * heads * d  # the group's products fit in qkv's size
        assert g == heads or (g + 1) * terms * slots > 3 * heads * d  # and no more heads would
        small = GROUP_FROM_BYTES // (heads * slots * terms * 4)  # the most tokens whose products are small
        assert head_group(heads, d, slots, terms, small) == heads  # one call
        assert head_group(heads, d, slots, terms, small + 1, 4) == g
        assert head_group(heads, d, slots, terms, small + 1, 2) == heads  # (half the bytes in bf16)
    assert head_group(12, 64, 512, 2, 2048) == 2  # DeBERTa-v3-base, one 2,048-token text
    assert head_group(12, 64, 256, 2, 1024) == 12  # 8 x 128 tokens: 25 MB of products, one call


def test_inference_in_head_groups_equals_all_heads_at_once(monkeypatch):
    # no grad: heads run in groups (2, 2, 1 here: the last one short), each group's c2p / p2c made and freed in
    # turn; the output is the all-heads call's, bit for bit, and transformers'
    from fastenc import ops
    from fastenc.models import deberta_v2_encoder as enc

    hf = _hf.deberta_v2("base", hidden=60, heads=5)
    fe = fastenc.from_hf(hf)
    ids, mask, types = _batch(seed=9)
    calls = []
    attention = ops.attention
    monkeypatch.setattr(ops, "attention", lambda q, *a, **k: calls.append(q.shape[1]) or attention(q, *a, **k))
    with torch.no_grad():
        monkeypatch.setattr(enc, "head_group", lambda heads, *a: 2)
        grouped = fe(ids, mask, types)
        assert calls == [2, 2, 1] * hf.config.num_hidden_layers
        monkeypatch.setattr(enc, "head_group", lambda heads, *a: heads)
        whole = fe(ids, mask, types)
        ref = hf(ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    assert len(calls) == 3 * hf.config.num_hidden_layers  # (all heads at once: attention_qkv, not ops.attention)
    assert torch.equal(grouped, whole)
    _close(grouped, ref, mask)


@pytest.mark.parametrize("terms", ["both", "c2p", "p2c"])
def test_qk_products_in_place_match_einsum_and_gradcheck(terms):
    # training's per-head products (views of qkv in, in-place gradient blocks out) against einsum, and gradcheck
    from fastenc.models.deberta_v2_encoder import _QKProducts

    g = torch.Generator().manual_seed(4)
    t, heads, d, slots = 13, 3, 5, 7
    qkv = torch.randn(t, 3 * heads * d, generator=g, dtype=torch.float64, requires_grad=True)
    pk = torch.randn(slots, heads, d, generator=g, dtype=torch.float64, requires_grad=True) if terms != "p2c" else None
    pq = torch.randn(slots, heads, d, generator=g, dtype=torch.float64, requires_grad=True) if terms != "c2p" else None
    c2p, p2c = _QKProducts.apply(qkv, pk, pq, heads)
    q, k, _ = qkv.view(t, 3, heads, d).unbind(1)
    want = [None if pk is None else torch.einsum("thd,shd->ths", q, pk),
            None if pq is None else torch.einsum("thd,shd->ths", k, pq)]
    for got, ref in zip((c2p, p2c), want):
        assert (got is None) == (ref is None)
        if ref is not None:
            torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)
    leaves = [x for x in (qkv, pk, pq) if x is not None]
    outs = [x for x in (c2p, p2c) if x is not None]
    grads = [torch.randn(x.shape, generator=g, dtype=torch.float64) for x in outs]
    ours = torch.autograd.grad(outs, leaves, grads)
    refs = torch.autograd.grad([x for x in want if x is not None], leaves, grads)
    for a, b in zip(ours, refs):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert torch.autograd.gradcheck(lambda *xs: [y for y in _QKProducts.apply(
        xs[0], xs[1] if pk is not None else None, xs[-1] if pq is not None else None, heads) if y is not None],
        tuple(leaves))


def test_bf16_by_the_tolerance_rule():
    dtype = torch.bfloat16
    hf = _hf.deberta_v2("base")
    ids, mask, _ = _batch(seed=21)
    with torch.no_grad():
        ref32 = hf(ids, attention_mask=mask).last_hidden_state
        ref_lowp = _hf.deberta_v2("base").to(dtype)(ids, attention_mask=mask).last_hidden_state
        out = fastenc.from_hf(hf).to(dtype=dtype)(ids, mask)
    assert out.dtype == dtype
    m = mask.bool()
    testing.assert_close(out[m].float(), ref32[m], ref_lowp[m].float(), dtype=dtype)


@pytest.mark.parametrize("kind", ["ignored-negative", "regression", "soft", "multi-label"])
def test_sequence_classification_loss_as_transformers_deberta(kind):
    # without a problem_type transformers' DeBERTa ignores negative labels and reads float (batch, n) labels as
    # soft targets; with one it is the usual loss
    g = torch.Generator().manual_seed(8)
    kw = {"num_labels": 1} if kind == "regression" else {}
    if kind == "multi-label":
        kw["problem_type"] = "multi_label_classification"
    hf = _hf.deberta_v2("sequence_classification", **kw)
    fe = fastenc.from_hf(hf)
    ids, mask, _ = _batch(seed=8, left=False)
    labels = {"ignored-negative": torch.tensor([2, -1, 4, 0]), "regression": torch.randn(4, generator=g),
              "soft": torch.softmax(torch.randn(4, 5, generator=g), -1),
              "multi-label": (torch.rand(4, 5, generator=g) > 0.5).float()}[kind]
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, labels=labels)
        out = fe(ids, mask, labels=labels)
    assert type(out).__name__ == "SequenceClassifierOutput"
    _close(out.logits, ref.logits)
    assert abs(float(out.loss) - float(ref.loss)) <= TOL * max(1.0, abs(float(ref.loss)))
    assert fe.config.problem_type == hf.config.problem_type
    with pytest.raises(ValueError, match="labels must"):
        fe(ids, mask, labels=labels[:3])


def test_question_answering_loss_reads_the_padded_columns_as_transformers():
    hf = _hf.deberta_v2("question_answering")
    fe = fastenc.from_hf(hf)
    ids, mask, _ = _batch(seed=10)
    start, end = torch.tensor([3, 30, 0, 42]), torch.tensor([5, 7, 50, 42])  # 50: out of range, ignored
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, start_positions=start, end_positions=end)
        out = fe(ids, mask, start_positions=start, end_positions=end)
    assert type(out).__name__ == "QuestionAnsweringModelOutput"
    assert abs(float(out.loss) - float(ref.loss)) <= TOL


def _choices(seed=3):
    """(batch 2, choices 3, seq 19): mixed lengths, one choice left-padded, one with a hole."""
    ids, mask, types = _hf.text_batch([19, 7, 12, 1, 15, 19], seed=seed)
    mask[1] = mask[1].roll(5)
    mask[5, 4] = 0
    return (ids * mask).view(2, 3, 19), mask.view(2, 3, 19), types.view(2, 3, 19)


def test_multiple_choice():
    hf = _hf.deberta_v2("multiple_choice", **V2)
    fe = fastenc.from_hf(hf)
    ids, mask, types = _choices()
    labels = torch.tensor([2, 0])
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=types, labels=labels)
        out = fe(ids, mask, types, labels=labels)
        logits = fe(ids, mask, types)
    assert type(out).__name__ == "MultipleChoiceModelOutput" and logits.shape == (2, 3)
    _close(out.logits, ref.logits)
    _close(logits, ref.logits)
    assert abs(float(out.loss) - float(ref.loss)) <= TOL
    for bad, match in ((dict(input_ids=ids[0]), r"input_ids must be \(batch, choices, seq\)"),
                       (dict(input_ids=ids, labels=torch.tensor([3, 0])), r"labels must be class indices in \[0, 3\)"),
                       (dict(input_ids=ids, attention_mask=mask[:, :2]), "attention_mask must have input_ids' shape")):
        with pytest.raises(ValueError, match=match):
            fe(**bad)


@pytest.mark.parametrize("task,out_type", [("base", "BaseModelOutput"),
                                           ("sequence_classification", "SequenceClassifierOutput"),
                                           ("token_classification", "TokenClassifierOutput"),
                                           ("question_answering", "QuestionAnsweringModelOutput"),
                                           ("multiple_choice", "MultipleChoiceModelOutput")])
def test_accelerate(task, out_type):
    # column 0 as transformers computes it where it is padding (the row's padded state), every head on fastenc
    hf = _hf.deberta_v2(task)
    acc = fastenc.accelerate(hf)
    if task == "multiple_choice":
        ids, mask, _ = _choices(seed=11)
        labels = {"labels": torch.tensor([1, 2])}
    else:
        ids, mask, _ = _batch(seed=11)
        labels = {"labels": torch.tensor([1, 0, 4, 2])} if task == "sequence_classification" else {}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        out, fast = _hf.ran_fastenc(lambda: acc(input_ids=ids, attention_mask=mask, **labels))
        ref = hf(input_ids=ids, attention_mask=mask, **labels)
    assert fast and type(out).__name__ == out_type == type(ref).__name__
    if task == "question_answering":
        _close(out.start_logits, ref.start_logits, mask)
        _close(out.end_logits, ref.end_logits, mask)
    elif task == "base":
        _close(out.last_hidden_state, ref.last_hidden_state, mask)
        _close(out.last_hidden_state[:, 0], ref.last_hidden_state[:, 0])  # row 3's column 0 is padding
    elif task == "token_classification":
        _close(out.logits, ref.logits, mask)
    else:
        _close(out.logits, ref.logits)
        if labels:
            assert abs(float(out.loss) - float(ref.loss)) <= TOL


@pytest.mark.parametrize("task,kw", [("sequence_classification", {}), ("masked_lm", dict(legacy=False)),
                                     ("masked_lm", V2)], ids=["seqcls-v3", "mlm-new-head", "mlm-legacy-v2"])
def test_save_pretrained_loads_in_transformers_and_fastenc(tmp_path, task, kw):
    hf = _hf.deberta_v2(task, **kw)
    fastenc.from_hf(hf).save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == "deberta-v2" and cfg["pos_att_type"] == hf.config.pos_att_type
    back = getattr(_hf.transformers, type(hf).__name__).from_pretrained(tmp_path, attn_implementation="eager")
    mine = back.state_dict()
    for k, v in hf.state_dict().items():
        assert torch.equal(mine[k], v), k
    again = fastenc.from_pretrained(tmp_path)
    assert type(again).__name__ == type(hf).__name__
    ids, mask, types = _batch(seed=2)
    with torch.no_grad():
        _check(task, again(ids, mask, types), hf(ids, attention_mask=mask, token_type_ids=types), mask)


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
def test_peft_adapter_on_the_default_targets(tmp_path, merge):
    # PEFT's default deberta-v2 targets (query_proj, value_proj) land on Wqkv's thirds; with share_att_key the
    # adapted query_proj also projects the relative embeddings (p2c), as in PEFT's model
    import copy

    from peft import LoraConfig, get_peft_model
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as defaults

    from fastenc.models.architecture import get

    targets = defaults["deberta-v2"]
    assert list(get("deberta-v2").lora_targets) == targets
    hf = _hf.deberta_v2("token_classification")
    pm = get_peft_model(copy.deepcopy(hf), LoraConfig(r=4, lora_alpha=8, target_modules=targets))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    pm.eval().save_pretrained(tmp_path)
    fe = fastenc.from_hf(hf)
    fe.load_lora(tmp_path, merge=merge)
    ids, mask, _ = _batch(seed=13)
    with torch.no_grad():
        ref = pm(input_ids=ids, attention_mask=mask).logits
        base = hf(input_ids=ids, attention_mask=mask).logits
        out = fe(ids, mask)
    assert float((ref - base)[mask.bool()].abs().max()) > 1e-3  # the adapter changes the outputs
    _close(out, ref, mask)


def test_configs_fastenc_cannot_serve_are_refused_by_name(tmp_path):
    from fastenc.models.deberta_v2 import DebertaV2Config

    d = _hf.deberta_v2("base").config.to_dict()
    for bad, match in (({"conv_kernel_size": 3}, "conv_kernel_size must be 0"),
                       ({"pos_att_type": ["p2c", "p2p"]}, "pos_att_type must list only 'c2p' and 'p2c'"),
                       ({"attention_head_size": 8}, "attention_head_size must be"),
                       ({"pooler_hidden_size": 32}, "pooler_hidden_size must equal hidden_size"),
                       ({"legacy": False, "embedding_size": 40}, "legacy=False .* needs embedding_size == hidden_size"),
                       ({"max_relative_positions": 5}, "position_buckets .* needs max_relative_positions"),
                       ({"hidden_act": "swish_xyz"}, "unsupported activation")):
        with pytest.raises(ValueError, match=match):
            DebertaV2Config.from_dict({**d, **bad})
    assert DebertaV2Config.from_dict({**d, "pos_att_type": "p2c|c2p"}).pos_att_type == ["p2c", "c2p"]
    with pytest.raises(ValueError, match="num_labels=2"):
        fastenc.from_hf(_hf.deberta_v2("question_answering", num_labels=3))
    # DeBERTa-v1 (model_type "deberta") is not served: the error names it
    v1 = _hf.transformers.DebertaConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                        intermediate_size=20)
    with pytest.raises(ValueError, match="unsupported architecture 'DebertaModel'"):
        fastenc.from_hf(_hf.transformers.DebertaModel(v1))
    (tmp_path / "config.json").write_text(json.dumps({**v1.to_dict(), "architectures": ["DebertaModel"]}))
    with pytest.raises(ValueError, match="unsupported architecture 'DebertaModel'"):
        fastenc.from_pretrained(tmp_path)
