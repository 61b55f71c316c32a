"""BGE-M3's outputs from one forward against plain PyTorch over transformers' last hidden states, as FlagEmbedding's
BGEM3 computes them (dense: normalized CLS; sparse: max relu(sparse_linear(h)) per token id, cls/eos/pad/unk left
out; colbert: normalized colbert_linear(h[1:]) over the real tokens); the heads read from a folder's
sparse_linear.pt / colbert_linear.pt by fastenc.from_pretrained; bad arguments refused naming them."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import fastenc
from _models_hf import xlm_roberta
from fastenc.models import bge_m3

SPECIAL = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
LENGTHS = [6, 2, 19, 11]


def _seqs(vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in LENGTHS:
        body = torch.randint(4, 12, (n - 2,), generator=g).tolist()  # few distinct ids: repeats are certain
        if n > 4:
            body[1] = 3  # an <unk> inside the text
        out.append([0, *body, 2])
    return out


def _heads(hidden, dim=24, seed=1):
    g = torch.Generator().manual_seed(seed)
    return {"sparse": (torch.randn(1, hidden, generator=g) * 0.3, torch.randn(1, generator=g) * 0.1),
            "colbert": (torch.randn(dim, hidden, generator=g) * 0.1, torch.randn(dim, generator=g) * 0.1)}


def _expected(hf, seqs, heads):
    """FlagEmbedding BGEM3's math, over a right-padded batch."""
    width = max(map(len, seqs))
    ids = torch.ones(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = 1
    with torch.no_grad():
        h = hf(input_ids=ids, attention_mask=mask).last_hidden_state
        dense = F.normalize(h[:, 0], dim=-1)
        sw = torch.relu(F.linear(h, *heads["sparse"])).squeeze(-1)
        col = F.normalize(F.linear(h[:, 1:], *heads["colbert"]), dim=-1)
    sparse, colbert = [], []
    for i, s in enumerate(seqs):
        d = {}
        for t, tid in enumerate(s):
            if tid in SPECIAL.values():
                continue
            w = float(sw[i, t])
            if w > 0 and w > d.get(tid, 0.0):
                d[tid] = w
        sparse.append(d)
        colbert.append(col[i, :len(s) - 1])
    return dense, sparse, colbert


def _folder(tmp_path, hf, heads):
    """A BGE-M3-like folder: the encoder, a word-level tokenizer.json with XLM-R's special tokens, the two heads."""
    from tokenizers import Tokenizer, models

    fe = fastenc.from_hf(hf)
    fe.save_pretrained(tmp_path)
    vocab = {**SPECIAL, **{f"w{i}": i for i in range(4, hf.config.vocab_size)}}
    Tokenizer(models.WordLevel(vocab, unk_token="<unk>")).save(str(tmp_path / "tokenizer.json"))
    for name, (w, b) in heads.items():
        torch.save({"weight": w, "bias": b}, tmp_path / bge_m3.HEAD_FILES[name])
    return tmp_path


def test_outputs_match_plain_pytorch(tmp_path):
    hf = xlm_roberta("base", seed=2)
    heads = _heads(hf.config.hidden_size)
    model = fastenc.from_pretrained(_folder(tmp_path, hf, heads)).eval()
    assert set(bge_m3.heads_of(model)) == {"sparse", "colbert"}
    assert bge_m3.special_ids(model) == [0, 1, 2, 3]
    seqs = _seqs(hf.config.vocab_size)
    out = model.encode_m3(seqs, batch_size=3)  # length-sorted batches: the output is back in input order
    dense, sparse, colbert = _expected(hf, seqs, heads)
    torch.testing.assert_close(out["dense"], dense, rtol=1e-4, atol=1e-5)
    for (idx, vals), want in zip(out["sparse"], sparse):
        assert sorted(idx.tolist()) == sorted(want) and (vals[:-1] >= vals[1:]).all()
        torch.testing.assert_close(vals, torch.tensor([want[i] for i in idx.tolist()]), rtol=1e-4, atol=1e-5)
    assert out["colbert"].offsets.tolist() == [0, *torch.tensor([n - 1 for n in LENGTHS]).cumsum(0).tolist()]
    torch.testing.assert_close(out["colbert"].vectors, torch.cat(colbert), rtol=1e-4, atol=1e-5)
    # encode(output='multi_vector', skip_first_token=True) uses the folder's colbert head: the same vectors
    mv = model.encode(seqs, output="multi_vector", skip_first_token=True)
    torch.testing.assert_close(mv.vectors, out["colbert"].vectors, rtol=1e-5, atol=1e-6)
    only = model.encode_m3(seqs, sparse=False, colbert=False)
    assert list(only) == ["dense"]


def test_without_tokenizer_needs_exclude_ids():
    hf = xlm_roberta("base", seed=3)
    model = fastenc.from_hf(hf).eval()
    heads = _heads(hf.config.hidden_size)
    for name, (w, b) in heads.items():
        bge_m3.set_head(model, name, w, b)
    seqs = _seqs(hf.config.vocab_size, seed=4)
    with pytest.raises(ValueError, match="encode_m3: sparse=True needs exclude_ids="):
        model.encode_m3(seqs)
    out = model.encode_m3(seqs, exclude_ids=list(SPECIAL.values()))
    _, sparse, _ = _expected(hf, seqs, heads)
    assert [sorted(i.tolist()) for i, _ in out["sparse"]] == [sorted(d) for d in sparse]


def test_bad_heads_and_arguments(tmp_path):
    hf = xlm_roberta("base")
    model = fastenc.from_hf(hf).eval()
    h = hf.config.hidden_size
    with pytest.raises(ValueError, match="encode_m3: sparse=True needs the sparse head"):
        model.encode_m3([[0, 5, 2]], exclude_ids=[0])
    with pytest.raises(ValueError, match=rf"set_head: the sparse weight must be \(1, {h}\)"):
        bge_m3.set_head(model, "sparse", torch.zeros(2, h), None)
    with pytest.raises(ValueError, match=r"set_head: the colbert bias must be \(8,\)"):
        bge_m3.set_head(model, "colbert", torch.zeros(8, h), torch.zeros(3))
    with pytest.raises(ValueError, match="set_head: name must be one of"):
        bge_m3.set_head(model, "dense", torch.zeros(1, h), None)
    (tmp_path / "sparse_linear.pt").write_text(json.dumps({"weight": 1}))
    with pytest.raises(ValueError, match="load_heads: cannot read"):
        bge_m3.load_heads(model, tmp_path)
    with pytest.raises(ValueError, match="encode_m3: batch_size must be a positive int"):
        model.encode_m3([[0, 5, 2]], dense=True, sparse=False, colbert=False, batch_size=0)
