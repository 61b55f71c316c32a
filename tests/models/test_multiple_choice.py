"""The multiple-choice head (fastenc.models.multiple_choice) of every text architecture that transformers gives a
*ForMultipleChoice class, against transformers (eager attention, fp32, random weights, hidden 36 with 3 heads,
4 choices of 13 columns with right padding, left padding and holes in the masks): logits and the loss (a -100
label ignored) from the fastenc forward and through accelerate; ELECTRA's other sequence summaries and
ModernBERT's mean pooling; training (labels -> loss backward, every gradient against transformers' through the
inverse weight map) and the choice dropout; save_pretrained / from_pretrained both ways; bad input and a choice
with no real token (refused by the forward, run by transformers under accelerate)."""
from __future__ import annotations

import warnings

import pytest
import torch

import fastenc
import _models_hf as _hf
from fastenc.models import architecture, convert
from fastenc.models.hf import FallbackWarning

ARCHS = [a for a, spec in architecture.architectures().items() if "multiple_choice" in spec.heads]
SMALL = dict(hidden=36, heads=3)
TOL = 1e-4
PAD1 = {"roberta", "xlm-roberta", "camembert", "mpnet"}  # (pad id 1: positions count the ids that are not it)
TYPES = {"bert", "electra", "albert"}  # (two token types)
VARIANTS = [(a, {}) for a in ARCHS] + [
    ("electra", {"summary_type": "last"}), ("electra", {"summary_type": "mean"}),
    ("electra", {"summary_type": "cls_index", "summary_use_proj": False, "summary_activation": "tanh"}),
    ("modernbert", {"pooling": "mean"})]
# Every dropout of the model off (training compares gradients with transformers'), per architecture.
NO_DROP = {
    "bert": dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
    "roberta": dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
    "xlm-roberta": dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
    "camembert": dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
    "mpnet": dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
    "albert": dict(classifier_dropout_prob=0.0),
    "distilbert": dict(dropout=0.0, attention_dropout=0.0, seq_classif_dropout=0.0),
    "electra": dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, summary_last_dropout=0.0),
    "modernbert": {},
    "deberta-v2": dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pooler_dropout=0.0),
}
# The config field of the dropout before the classifier (fastenc side).
CHOICE_DROPOUT = {"bert": "classifier_dropout", "roberta": "hidden_dropout_prob", "xlm-roberta": "hidden_dropout_prob",
                  "camembert": "hidden_dropout_prob", "mpnet": "hidden_dropout_prob",
                  "albert": "classifier_dropout_prob", "distilbert": "seq_classif_dropout",
                  "electra": "summary_last_dropout", "modernbert": "classifier_dropout", "deberta-v2": "cls_dropout"}


def test_every_text_architecture_with_a_transformers_head_is_served():
    expected = {"bert", "roberta", "xlm-roberta", "camembert", "distilbert", "electra", "albert", "mpnet",
                "modernbert", "deberta-v2"}
    assert set(ARCHS) == expected
    for a in ARCHS:
        spec = architecture.get(a)
        assert spec.hf_class("multiple_choice").endswith("ForMultipleChoice")
        assert spec.hf_class("multiple_choice") not in spec.encoder_of


def _model(arch: str, seed: int = 0, **kw):
    return architecture.get(arch).tiny_model("multiple_choice", seed, **SMALL, **kw)


def _choices(arch: str, b: int = 3, c: int = 4, s: int = 13, seed: int = 0):
    """ids, mask, types (batch, choices, seq): mixed right-padded lengths, choice (0, 1) with a hole, choice (1, 2)
    left-padded, choice (2, 0) full; padded ids are the pad id; types None where the architecture has none."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 200, (b, c, s), generator=g)
    lengths = torch.randint(4, s + 1, (b, c), generator=g)
    mask = (torch.arange(s)[None, None] < lengths[..., None]).long()
    mask[0, 1] = 1
    mask[0, 1, 5:8] = 0
    mask[1, 2] = 1
    mask[1, 2, :3] = 0
    mask[2, 0] = 1
    ids = torch.where(mask.bool(), ids, torch.full_like(ids, 1 if arch in PAD1 else 0))
    types = torch.randint(0, 2, (b, c, s), generator=g) * mask if arch in TYPES else None
    return ids, mask, types


def _hf_args(ids, mask, types) -> dict:
    return {"input_ids": ids, "attention_mask": mask, **({} if types is None else {"token_type_ids": types})}


def _fe_args(arch, ids, mask, types) -> tuple:
    return (ids, mask, types) if architecture.get(arch).token_types else (ids, mask)


def _close(out, ref, tol=TOL):
    assert out.shape == ref.shape, (tuple(out.shape), tuple(ref.shape))
    assert torch.isfinite(out).all()
    err = float((out.detach() - ref.detach()).abs().max())
    assert err <= tol * max(1.0, float(ref.detach().abs().max())), f"max abs error {err:.3e}"


LABELS = torch.tensor([2, -100, 0])


@pytest.mark.parametrize("arch,kw", VARIANTS, ids=[a + "".join(f"-{v}" for v in kw.values()) for a, kw in VARIANTS])
def test_parity_with_transformers_and_accelerate(arch, kw):
    hf = _model(arch, seed=1, **kw)
    fe = fastenc.from_hf(hf)
    assert type(fe).__name__ == type(hf).__name__
    ids, mask, types = _choices(arch, seed=2)
    with torch.no_grad():
        ref = hf(**_hf_args(ids, mask, types), labels=LABELS)
        logits = fe(*_fe_args(arch, ids, mask, types))
        out = fe(*_fe_args(arch, ids, mask, types), labels=LABELS)
    assert logits.shape == (3, 4) and type(out).__name__ == "MultipleChoiceModelOutput"
    _close(logits, ref.logits)
    _close(out.logits, ref.logits)
    _close(out.loss, ref.loss)
    acc = fastenc.accelerate(hf)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        got, ran = _hf.ran_fastenc(lambda: acc(**_hf_args(ids, mask, types), labels=LABELS))
    assert ran and type(got) is type(ref)
    _close(got.logits, ref.logits)
    _close(got.loss, ref.loss)


def _hf_grads(fe, grads: dict) -> dict:
    entries = [e for e in architecture.of_model(fe).entries(fe.config, fe.task) if e[0] in grads]
    return convert.fastenc_to_hf(entries, grads, fe.config)


@pytest.mark.parametrize("arch", ARCHS)
def test_training_gradients_match_transformers(arch):
    hf = _model(arch, seed=3, **NO_DROP[arch]).train()
    fe = fastenc.from_hf(hf).train()
    ids, mask, types = _choices(arch, seed=4)
    labels = torch.tensor([1, 3, 0])
    ref = hf(**_hf_args(ids, mask, types), labels=labels)
    out = fe(*_fe_args(arch, ids, mask, types), labels=labels)
    _close(out.logits, ref.logits)
    _close(out.loss, ref.loss)
    ref.loss.backward()
    out.loss.backward()
    mine = _hf_grads(fe, {n: p.grad for n, p in fe.named_parameters() if p.grad is not None})
    theirs = {n: p.grad for n, p in hf.named_parameters() if p.grad is not None}
    scale = max(float(g.abs().max()) for g in theirs.values())
    assert "classifier.weight" in theirs and theirs.keys() <= mine.keys(), sorted(theirs.keys() - mine.keys())
    for name, g in theirs.items():
        err = float((mine[name] - g).abs().max())
        assert err <= 1e-4 * max(float(g.abs().max()), 1e-2 * scale), f"{name}: gradient error {err:.3e}"


@pytest.mark.parametrize("arch", ARCHS)
def test_choice_dropout_in_training_only(arch):
    fe = fastenc.from_hf(_model(arch, seed=5, **NO_DROP[arch]))
    setattr(fe.config, CHOICE_DROPOUT[arch], 0.5)
    ids, mask, types = _choices(arch, seed=6)
    args = _fe_args(arch, ids, mask, types)
    with torch.no_grad():
        ref = fe.eval()(*args)
        torch.manual_seed(0)
        a = fe.train()(*args)
        b = fe(*args)
        again = fe.eval()(*args)
    assert torch.equal(again, ref)
    assert not torch.allclose(a, b) and not torch.allclose(a, ref)


@pytest.mark.parametrize("arch", ARCHS)
def test_save_pretrained_and_reload_both_ways(arch, tmp_path):
    hf = _model(arch, seed=7)
    ids, mask, types = _choices(arch, seed=8)
    with torch.no_grad():
        ref = hf(**_hf_args(ids, mask, types)).logits
    hf.save_pretrained(tmp_path / "hf")
    fe = fastenc.from_pretrained(tmp_path / "hf")
    assert type(fe).__name__ == type(hf).__name__ and fe.task == "multiple_choice"
    fe.save_pretrained(tmp_path / "fe")
    back = type(hf).from_pretrained(tmp_path / "fe", attn_implementation="eager").eval()
    assert set(back.state_dict()) == set(hf.state_dict())
    for k, v in hf.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    again = fastenc.from_pretrained(tmp_path / "fe")
    with torch.no_grad():
        _close(fe(*_fe_args(arch, ids, mask, types)), ref)
        _close(again(*_fe_args(arch, ids, mask, types)), ref)
        _close(back(**_hf_args(ids, mask, types)).logits, ref)


def test_bad_input():
    fe = fastenc.from_hf(_model("bert"))
    ids, mask, types = _choices("bert")
    for kw, match in ((dict(input_ids=ids[0]), r"input_ids must be \(batch, choices, seq\)"),
                      (dict(input_ids=ids, attention_mask=mask[:, :2]), "attention_mask must have input_ids' shape"),
                      (dict(input_ids=ids, token_type_ids=types[..., :5]), "token_type_ids must have input_ids' shape"),
                      (dict(input_ids=ids, labels=torch.tensor([4, 0, 1])), r"labels must be class indices in \[0, 4\)"),
                      (dict(input_ids=ids, labels=torch.tensor([0.0, 1.0, 1.0])), "labels must be an integer tensor"),
                      (dict(input_ids=ids, labels=torch.tensor([0, 1])), r"labels must be an integer tensor of shape \(3,\)")):
        with pytest.raises(ValueError, match=match):
            fe(**kw)
    distil = fastenc.from_hf(_model("distilbert"))
    with pytest.raises(ValueError, match="token_type_ids must be None"):
        distil(ids, mask, types)
    from fastenc.models.electra import ElectraConfig, ElectraForMultipleChoice

    with pytest.raises(ValueError, match="summary_type must be one of"):
        ElectraForMultipleChoice(ElectraConfig(summary_type="attn"))
    with pytest.raises(ValueError, match=r"summary_proj_to_labels=True projects the summary to num_labels \(3\)"):
        ElectraForMultipleChoice(ElectraConfig(summary_proj_to_labels=True, num_labels=3))


@pytest.mark.parametrize("arch", ["bert", "modernbert", "electra"])
def test_a_choice_without_real_tokens(arch):
    # transformers scores it from uniform attention over the padding: the forward refuses it, naming the choice;
    # accelerate runs transformers' forward for that call, with a FallbackWarning
    hf = _model(arch, seed=9)
    fe = fastenc.from_hf(hf)
    ids, mask, types = _choices(arch, seed=10)
    mask[2, 3] = 0
    with pytest.raises(ValueError, match=r"attention_mask has a choice with no real token \(batch 2, choice 3\)"):
        fe(*_fe_args(arch, ids, mask, types))
    acc = fastenc.accelerate(hf)
    with torch.no_grad():
        ref = hf(**_hf_args(ids, mask, types)).logits
        with pytest.warns(FallbackWarning, match="a choice of attention_mask has no real token"):
            got = acc(**_hf_args(ids, mask, types)).logits
    assert torch.equal(got, ref)
