"""A model run on prepacked CPU weights (fastenc.layers.prepack) keeps showing plain tensors: state_dict, deepcopy,
pickle, LoRA merge (written into the weights in place) and unmerge, load_state_dict into a packed model stay correct."""
from __future__ import annotations

import copy
import io

import pytest
import torch

import _models_hf as _hf
import fastenc
from _peft_helpers import peft_model
from fastenc import testing
from fastenc.layers import Linear, prepack


def _packed_parts(lin: Linear, path: str) -> int:
    """Packed weight blocks held by `lin` for `path`: fastenc's panels or oneDNN's."""
    cache = lin.__dict__.get("_panels" if path == "panels" else "_pack")
    return len(cache.packed) if cache is not None else 0


@pytest.mark.parametrize("path", ["panels", "onednn"])
def test_model_after_packing(monkeypatch, path):
    """BERT run packed, then: state_dict plain and unchanged, deepcopy/pickle, LoRA merge and unmerge,
    load_state_dict into a packed model, all matching transformers / PEFT. path: fastenc's panel GEMM, or oneDNN's
    packed one (as a call takes it with the extension not loaded)."""
    if path == "onednn":
        if not torch.backends.mkldnn.is_available():
            pytest.skip("torch built without oneDNN")
        monkeypatch.setattr(prepack, "use_panels", lambda x, w: False)
    hf = _hf.bert("base", hidden=384, heads=6)   # 384 x 384 blocks: above prepack.MIN_WEIGHT
    ids, mask, types = _hf.text_batch([37, 30], seed=7)  # 67 tokens: above prepack.MIN_TOKENS_SMALL
    fe = fastenc.from_hf(hf)
    snap = {k: v.clone() for k, v in fe.state_dict().items()}
    with torch.inference_mode():
        ref = hf(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        testing.assert_close(fe(ids, mask, types)[mask.bool()], ref[mask.bool()])
    assert sum(_packed_parts(m, path) for m in fe.modules() if isinstance(m, Linear)) > 0
    state = fe.state_dict()
    assert all(v.layout == torch.strided and torch.equal(v, snap[k]) for k, v in state.items())
    buf = io.BytesIO()
    torch.save(fe, buf)
    for other in (copy.deepcopy(fe), torch.load(io.BytesIO(buf.getvalue()), weights_only=False)):
        with torch.inference_mode():
            testing.assert_close(other(ids, mask, types)[mask.bool()], ref[mask.bool()])

    pm = peft_model(hf, r=4, lora_alpha=8, target_modules=["query", "value", "dense"])
    with torch.no_grad():
        lref = pm(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    fe.load_lora(pm, merge=True)                                  # writes into the packed weights' tensors
    with torch.inference_mode():
        testing.assert_close(fe(ids, mask, types)[mask.bool()], lref[mask.bool()])
    back = fastenc.from_hf(hf)
    with torch.inference_mode():
        back(ids, mask, types)                                    # packs the base weights
    back.load_state_dict(fe.state_dict())                         # copied into them in place
    with torch.inference_mode():
        testing.assert_close(back(ids, mask, types)[mask.bool()], lref[mask.bool()])
    fe.unmerge_lora()
    with torch.inference_mode():
        testing.assert_close(fe(ids, mask, types)[mask.bool()], ref[mask.bool()])
    assert all(torch.equal(v, snap[k]) for k, v in fe.state_dict().items())
