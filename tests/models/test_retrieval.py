"""Retrieval outputs of encode(): SPLADE sparse weights of every masked-LM architecture against plain PyTorch over
transformers' logits (log1p(relu(logits)) max over the real tokens), ColBERT multi-vectors against plain PyTorch
over transformers' last hidden states (ragged, first token kept or skipped, with and without a projection), the
input order kept through encode's length sort, bad arguments refused naming them."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fastenc
from _models_hf import bert, distilbert, modernbert, roberta, roberta_batch, text_batch

LENGTHS = [5, 1, 17, 12]


def _batch(arch, vocab):
    if arch is roberta:
        ids, mask = roberta_batch(LENGTHS, vocab=vocab)
    else:
        ids, mask, _ = text_batch(LENGTHS, vocab=vocab)
    return ids, mask


def _dense(rows, vocab):
    out = torch.zeros(len(rows), vocab)
    for i, (idx, vals) in enumerate(rows):
        out[i, idx] = vals
    return out


@pytest.mark.parametrize("arch", [bert, distilbert, roberta, modernbert],
                         ids=["bert", "distilbert", "roberta", "modernbert"])
def test_sparse_matches_plain_pytorch(arch):
    hf = arch("masked_lm", seed=3)
    fe = fastenc.from_hf(hf).eval()
    vocab = hf.config.vocab_size
    ids, mask = _batch(arch, vocab)
    with torch.no_grad():
        logits = hf(input_ids=ids, attention_mask=mask).logits  # (batch, seq, vocab)
    want = torch.log1p(torch.relu(logits)).masked_fill(~mask.bool()[..., None], 0).amax(1)
    rows = fe.encode(ids, mask, output="sparse")
    assert len(rows) == len(LENGTHS)
    for idx, vals in rows:
        assert idx.dtype == torch.int64 and vals.dtype == torch.float32
        assert (vals > 0).all() and (vals[:-1] >= vals[1:]).all()  # non-zero only, largest first
    torch.testing.assert_close(_dense(rows, vocab), want, rtol=1e-4, atol=1e-5)
    top = fe.encode(ids, mask, output="sparse", top_k=7)
    for (i_all, v_all), (i_top, v_top) in zip(rows, top):
        assert len(i_top) == min(7, len(i_all))
        torch.testing.assert_close(v_top, v_all[:7])
        assert torch.equal(i_top, i_all[:7])


def test_sparse_of_token_lists_keeps_input_order():
    """Token-id lists are length-sorted into batches: the output is back in input order and equals one call per text."""
    hf = bert("masked_lm", seed=1)
    fe = fastenc.from_hf(hf).eval()
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(3, 211, (n,), generator=g).tolist() for n in (3, 40, 1, 9, 22)]
    rows = fe.encode(seqs, output="sparse", batch_size=2)
    for s, (idx, vals) in zip(seqs, rows):
        one_i, one_v = fe.encode([s], output="sparse")[0]
        assert torch.equal(idx, one_i)
        torch.testing.assert_close(vals, one_v, rtol=1e-5, atol=1e-6)


def test_sparse_reference_backend_agrees():
    hf = bert("masked_lm", seed=2)
    fe = fastenc.from_hf(hf).eval()
    ids, mask, _ = text_batch(LENGTHS)
    fast = _dense(fe.encode(ids, mask, output="sparse"), 211)
    with fastenc.use_backend("reference"):
        ref = _dense(fe.encode(ids, mask, output="sparse"), 211)
    torch.testing.assert_close(fast, ref, rtol=1e-4, atol=1e-5)


def _expected_vectors(hf, ids, mask, weight=None, bias=None, skip=0):
    with torch.no_grad():
        h = hf(input_ids=ids, attention_mask=mask).last_hidden_state
        if weight is not None:
            h = F.linear(h, weight, bias)
        h = F.normalize(h, dim=-1)
    return [h[i, skip:int(mask[i].sum())] for i in range(ids.shape[0])]


@pytest.mark.parametrize("skip", [False, True], ids=["keep-first", "skip-first"])
@pytest.mark.parametrize("proj", ["none", "weight", "pair", "linear", "attribute"])
def test_multi_vector_matches_plain_pytorch(skip, proj):
    hf = bert("base", seed=4)
    fe = fastenc.from_hf(hf).eval()
    ids, mask, _ = text_batch(LENGTHS)
    g = torch.Generator().manual_seed(5)
    lin = torch.nn.Linear(64, 24)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(24, 64, generator=g) * 0.1)
        lin.bias.copy_(torch.randn(24, generator=g) * 0.1)
    arg = {"none": None, "weight": lin.weight.detach(), "pair": (lin.weight.detach(), lin.bias.detach()),
           "linear": lin, "attribute": None}[proj]
    if proj == "attribute":
        fe.colbert_linear = lin
    out = fe.encode(ids, mask, output="multi_vector", projection=arg, skip_first_token=skip)
    w = None if proj == "none" else lin.weight.detach()
    b = lin.bias.detach() if proj in ("pair", "linear", "attribute") else None
    want = _expected_vectors(hf, ids, mask, w, b, int(skip))
    lens = [t.shape[0] for t in want]
    assert out.offsets.dtype == torch.int64 and out.offsets.tolist() == [0, *torch.tensor(lens).cumsum(0).tolist()]
    assert out.vectors.shape == (sum(lens), 64 if w is None else 24) and out.vectors.dtype == torch.float32
    torch.testing.assert_close(out.vectors, torch.cat(want), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.vectors.norm(dim=-1), torch.ones(sum(lens)), rtol=0, atol=1e-5)
    torch.testing.assert_close(out.of(2), want[2], rtol=1e-4, atol=1e-5)


def test_multi_vector_of_token_lists_keeps_input_order():
    hf = bert("base", seed=6)
    fe = fastenc.from_hf(hf).eval()
    seqs = [[5, 6, 7], list(range(3, 40)), [9], [4, 4, 8, 100, 17]]
    out = fe.encode(seqs, output="multi_vector", batch_size=2, skip_first_token=True)
    assert out.offsets.tolist() == [0, 2, 38, 38, 42]
    for i, s in enumerate(seqs):
        torch.testing.assert_close(out.of(i), fe.encode([s], output="multi_vector", skip_first_token=True).vectors,
                                   rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kw,match", [
    (dict(output="colbert"), "encode: output must be one of"),
    (dict(output="sparse"), r"encode: output='sparse' needs a masked-LM model .*got BertModel"),
    (dict(output="multi_vector", top_k=3), "encode: top_k applies to output='sparse' only"),
    (dict(output="multi_vector", dimensions=8), "encode: dimensions applies to output='dense' only"),
    (dict(output="dense", projection=torch.zeros(8, 64)), "encode: projection applies to output='multi_vector'"),
    (dict(output="multi_vector", projection=torch.zeros(8, 63)), r"encode: projection weight must be \(dim, 64\)"),
    (dict(output="multi_vector", projection=(torch.zeros(8, 64), torch.zeros(7))),
     r"encode: projection bias must be \(8,\)"),
    (dict(output="multi_vector", projection="linear"), "encode: projection must be a"),
])
def test_bad_arguments(kw, match):
    fe = fastenc.from_hf(bert("base")).eval()
    with pytest.raises((ValueError, TypeError), match=match):
        fe.encode([[5, 6, 7]], **kw)


@pytest.mark.parametrize("top_k", [0, -1, 2.0, True])
def test_bad_top_k(top_k):
    fe = fastenc.from_hf(bert("masked_lm")).eval()
    with pytest.raises(ValueError, match="encode: top_k must be a positive int or None"):
        fe.encode([[5, 6, 7]], output="sparse", top_k=top_k)


@pytest.mark.parametrize("density", [0.02, 0.6], ids=["sparse-rows", "dense-rows"])
@pytest.mark.parametrize("top_k", [None, 5])
def test_sparse_rows_order_and_ties(density, top_k):
    # Both ways of ordering (each row's non-zeros alone, or one stable sort of the matrix when some row is dense):
    # non-zeros only, largest first, equal values by ascending index, against plain Python.
    from fastenc.models import retrieval

    g = torch.Generator().manual_seed(int(density * 100) + (top_k or 0))
    w = torch.randint(1, 6, (3, 301), generator=g).float() / 4  # few distinct values: many ties
    w[torch.rand(3, 301, generator=g) > density] = 0
    w[1] = 0  # an all-zero row
    rows = retrieval.sparse_rows(w, top_k)
    for row, (idx, vals) in zip(w.tolist(), rows):
        want = sorted((-v, j) for j, v in enumerate(row) if v != 0)[:top_k]
        assert idx.tolist() == [j for _, j in want]
        assert vals.tolist() == [-v for v, _ in want]
        assert idx.dtype == torch.int64 and vals.dtype == torch.float32
