"""ModernBERT sequence classification with cls pooling runs the last layer's Wo, norms and MLP and the final norm
on each sequence's first token only: the pooled states, logits and gradients equal those of the full last layer."""
import pytest
import torch

import fastenc
from tests.models import _models_hf as _hf


def _pooled_full(model, ids, mask):
    x, batch = model._encode(ids, mask)
    return batch.first_tokens(x)


@pytest.mark.parametrize("layers", [1, 3])
def test_first_rows_equal_the_full_last_layer(layers):
    model = fastenc.from_hf(_hf.modernbert("sequence_classification", layers=layers))
    ids, mask, _ = _hf.text_batch([5, 17, 1, 9])
    mask[2] = 0  # an empty sequence: zeros, as first_tokens gives
    ids = ids * mask
    rows = []
    model.layers[-1].mlp.Wi.register_forward_hook(lambda mod, args, out: rows.append(out.shape[0]))
    with torch.no_grad():
        got, batch, _ = model._run(ids, mask, first_only=True)
        want = _pooled_full(model, ids, mask)
    assert rows == [4, batch.total]  # the last MLP ran on one row per sequence, then on every token
    assert got.shape == (4, model.config.hidden_size)
    assert torch.equal(got[2], torch.zeros_like(got[2]))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layers,lens,empty", [(3, [11, 4, 20], None), (2, [9, 3, 14], 1)],
                         ids=["mixed-lengths", "an-empty-sequence"])
def test_first_rows_gradients_equal_the_full_last_layer(layers, lens, empty):
    hf = _hf.modernbert("sequence_classification", layers=layers)
    ids, mask, _ = _hf.text_batch(lens)
    if empty is not None:
        mask[empty] = 0
        ids = ids * mask
    trimmed, full = fastenc.from_hf(hf).train(), fastenc.from_hf(hf).train()
    trimmed.classify(trimmed._run(ids, mask, first_only=True)[0]).square().sum().backward()
    full.classify(_pooled_full(full, ids, mask)).square().sum().backward()
    grads = dict(full.named_parameters())
    for name, p in trimmed.named_parameters():
        torch.testing.assert_close(p.grad, grads[name].grad, rtol=1e-4, atol=1e-6, msg=name)


def test_mean_pooling_still_reads_every_token():
    hf = _hf.modernbert("sequence_classification", layers=2, pooling="mean")
    ids, mask, _ = _hf.text_batch([6, 13])
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask).logits
        got = fastenc.from_hf(hf)(ids, mask)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


def test_first_rows_gather_gradient_equals_index_select():
    from fastenc.padding import gather_rows
    x = torch.randn(13, 7, dtype=torch.float64, requires_grad=True)
    rows = torch.tensor([0, 5, 5, 12])  # a repeated row (an empty sequence's stand-in): its gradients add up
    g = torch.randn(4, 7, dtype=torch.float64)
    got = gather_rows(x, rows)
    assert "RowGather" in type(got.grad_fn).__name__  # the index_put_ backward, not index_select's
    (dx,) = torch.autograd.grad(got, x, g)
    want = x.index_select(0, rows)
    (dx_want,) = torch.autograd.grad(want, x, g)
    assert torch.equal(got, want)
    torch.testing.assert_close(dx, dx_want, rtol=0, atol=1e-15)
    assert torch.count_nonzero(dx[1:5]) == 0 and torch.count_nonzero(dx[5]) == 7

