"""GTE, NomicBERT and Jina-embeddings-v3 (transformers' GteModel, NomicBertModel, JinaEmbeddingsV3Model: the same
post-norm RoPE blocks; NomicBERT's without biases, Jina-v3's with a plain MLP): parity with transformers (eager,
fp32, random weights, odd sizes, masks with holes) for every head and both gated activations (GeGLU, SwiGLU), with
and without token types; RoPE theta and scaling from the config; a long input; losses; first-step gradients;
save_pretrained round trip and the layout transformers saves; accelerate; LoRA; encode; Jina-v3's task adapters."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch

import fastenc
import _models_hf as _hf
from fastenc import testing
from fastenc.models import architecture, convert
from fastenc.models.hf import FallbackWarning

TOL = 1e-4
LENGTHS = [17, 1, 29, 40]
HEADS = ["base", "sequence_classification", "token_classification", "masked_lm"]
SMALL = dict(hidden=72, heads=4, layers=3)  # head_dim 18, intermediate 96
ARCHS = ["gte", "nomic_bert", "jina_embeddings_v3"]
GATED = ["gte", "nomic_bert"]
CLASSES = {"gte": _hf.GTE_CLASSES, "nomic_bert": _hf.NOMIC_BERT_CLASSES,
           "jina_embeddings_v3": _hf.JINA_EMBEDDINGS_V3_CLASSES}
NO_DROP = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _make(arch, task="base", **kw):
    return getattr(_hf, arch)(task, **kw)


def _close(out, ref, mask=None, tol=TOL):
    assert out.shape == ref.shape, (tuple(out.shape), tuple(ref.shape))
    out = out.detach()
    assert torch.isfinite(out).all()
    if mask is not None:
        out, ref = out[mask.bool()], ref[mask.bool()]
    err = float((out - ref).abs().max())
    assert err <= tol, f"max abs error {err:.3e} > {tol:.0e}"


def _batch(seed=5, lengths=LENGTHS):
    """Right padding plus holes inside the longest rows (real tokens not contiguous)."""
    ids, mask, types = _hf.text_batch(lengths, seed=seed)
    mask[3, 4] = mask[3, 20] = mask[2, 7] = 0
    return ids, mask, types


def _check(task, out, ref, mask):
    if task == "sequence_classification":
        _close(out, ref.logits)
    else:
        _close(out, ref.last_hidden_state if task == "base" else ref.logits, mask)


@pytest.mark.parametrize("act", ["gelu", "silu"], ids=["geglu", "swiglu"])
@pytest.mark.parametrize("task", HEADS)
@pytest.mark.parametrize("arch", ARCHS)
def test_parity(arch, task, act):
    hf = _make(arch, task, hidden_act=act, **SMALL)
    fe = fastenc.from_hf(hf)
    if arch in GATED:
        assert fe.layers[0].mlp.Wi.weight.shape == (2 * 96, 72)
    ids, mask, types = _batch()
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=types)
        _check(task, fe(ids, mask, types), ref, mask)
        if task == "base":  # encode()'s default: gte-base-en-v1.5's [CLS] token, nomic-embed-text's mean
            hidden = hf(ids, attention_mask=mask).last_hidden_state  # (encode reads no token types)
            m = mask[..., None].float()
            pooled = hidden[:, 0] if arch == "gte" else (hidden * m).sum(1) / m.sum(1)
            assert architecture.get(arch).pooling == ("cls" if arch == "gte" else "mean")
            _close(fe.encode(ids, mask), pooled)


def test_gte_without_token_types_and_wi_holds_gate_then_up():
    hf = _hf.gte("base", type_vocab_size=0, hidden=40, heads=2, layers=2)
    assert hf.embeddings.token_type_embeddings is None
    fe = fastenc.from_hf(hf)
    assert fe.embeddings.token_type is None
    mlp = hf.layers[1].mlp
    assert torch.equal(fe.layers[1].mlp.Wi.weight, torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
    ids, mask, types = _batch(seed=6)
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask).last_hidden_state
    _close(fe(ids, mask, types), ref, mask)  # (token types ignored, as transformers does without their embedding)


@pytest.mark.parametrize("rope", [{"rope_type": "default", "rope_theta": 500000.0},
                                  {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
                                  {"rope_type": "dynamic", "rope_theta": 20000.0, "factor": 2.0}],
                         ids=["theta", "linear", "dynamic"])
@pytest.mark.parametrize("arch", ARCHS)
def test_rope_parameters_from_the_config(arch, rope):
    hf = _make(arch, "base", rope_parameters=rope, max_position_embeddings=64, hidden=40, heads=2, layers=2)
    fe = fastenc.from_hf(hf)
    assert (fe.config.rope_type, fe.config.rope_theta) == (rope["rope_type"], rope["rope_theta"])
    ids, mask, types = _batch(seed=7, lengths=[64, 33, 5, 40])
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    _close(fe(ids, mask, types), ref, mask)
    default = fastenc.from_hf(_make(arch, "base", max_position_embeddings=64, hidden=40, heads=2, layers=2))
    if rope["rope_type"] != "dynamic":  # (dynamic NTK only rescales past max_position_embeddings)
        with torch.no_grad():
            other = default(ids, mask, types)
        assert float((other - ref)[mask.bool()].abs().max()) > 1e-3


@pytest.mark.parametrize("arch", ARCHS)
def test_unsupported_rope_and_activation_are_refused(arch):
    d = _make(arch, "base", layers=1).config.to_dict()
    for bad, match in (({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}},
                        r"rope_parameters\['rope_type'\] must be one of default, linear, dynamic.*'yarn'"),
                       ({"rope_parameters": None, "rope_scaling": {"type": "ntk", "factor": 2.0}},
                        r"rope_scaling\['rope_type'\] must be one of .*'ntk'"),
                       ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                             "partial_rotary_factor": 0.5}},
                        r"\['partial_rotary_factor'\] must be 1.0"),
                       ({"hidden_act": "relu"}, "hidden_act must be a GELU or silu")):
        if arch not in GATED and "hidden_act" in bad:  # (Jina-v3's plain MLP takes any activation)
            continue
        with pytest.raises(ValueError, match=match):
            architecture.get(arch).config.from_dict({**d, **bad})


@pytest.mark.parametrize("arch", ARCHS)
def test_long_input_padding_free(arch):
    # a few thousand tokens on a tiny config: one sequence of 3001 and one of 1234, packed without padding
    hf = _make(arch, "base", hidden=32, heads=2, layers=1, max_position_embeddings=4096)
    fe = fastenc.from_hf(hf)
    ids, mask, types = _hf.text_batch([3001, 1234], seed=8)
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        x, batch = fe(ids, mask, types, return_packed=True)
    assert x.shape == (3001 + 1234, 32) and batch.cu_seqlens.tolist() == [0, 3001, 4235]
    _close(batch.pad(x), ref, mask)
    with pytest.raises(ValueError, match="exceeds the position table"):
        fe(torch.ones(1, 4097, dtype=torch.long))


@pytest.mark.parametrize("arch", ARCHS)
def test_losses_match_transformers(arch):
    ids, mask, types = _batch(seed=9)
    g = torch.Generator().manual_seed(9)
    hf = _make(arch, "sequence_classification", **SMALL)
    labels = torch.randint(0, 5, (4,), generator=g)
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=types, labels=labels)
        out = fastenc.from_hf(hf)(ids, mask, types, labels=labels)
    assert type(out).__name__ == "SequenceClassifierOutput" and abs(float(out.loss) - float(ref.loss)) <= TOL
    hf = _make(arch, "token_classification", **SMALL)
    labels = torch.randint(0, 5, ids.shape, generator=g).masked_fill(mask == 0, -100)
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=types, labels=labels)
        out = fastenc.from_hf(hf)(ids, mask, types, labels=labels)
    assert abs(float(out.loss) - float(ref.loss)) <= TOL
    hf = _make(arch, "masked_lm", **SMALL)
    labels = torch.full(ids.shape, -100).masked_scatter(mask.bool() & (torch.rand(ids.shape, generator=g) < 0.3),
                                                        torch.randint(0, 211, ids.shape, generator=g))
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=types, labels=labels)
        out = fastenc.from_hf(hf)(ids, mask, types, labels=labels)
    assert abs(float(out.loss) - float(ref.loss)) <= TOL


def _grads_close(fe, hf, rtol=1e-4):
    mine = convert.fastenc_to_hf(architecture.of_model(fe).entries(fe.config, fe.task),
                                 {n: p.grad for n, p in fe.named_parameters()}, fe.config)
    # (a tied weight under each of its names: Jina-v3's masked LM registers lm_head.decoder first)
    ref = {n: p.grad for n, p in hf.named_parameters(remove_duplicate=False) if p.grad is not None}
    scale = max(float(t.abs().max()) for t in ref.values())
    assert set(mine) <= set(ref)
    for name, r in ((n, r) for n, r in ref.items() if n in mine):
        err = float((mine[name] - r).abs().max())
        assert err <= rtol * max(float(r.abs().max()), 1e-3 * scale), (name, err)


@pytest.mark.parametrize("act", ["gelu", "silu"], ids=["geglu", "swiglu"])
@pytest.mark.parametrize("task", ["sequence_classification", "token_classification", "masked_lm"])
@pytest.mark.parametrize("arch", ARCHS)
def test_first_step_gradients_match_transformers(arch, task, act):
    hf = _make(arch, task, hidden_act=act, **NO_DROP, **SMALL).train()
    fe = fastenc.from_hf(hf).train()
    ids, mask, types = _batch(seed=10)
    g = torch.Generator().manual_seed(10)
    if task == "sequence_classification":
        labels = torch.randint(0, 5, (4,), generator=g)
    else:
        labels = torch.randint(0, 5, ids.shape, generator=g).masked_fill(mask == 0, -100)
    ref = hf(ids, attention_mask=mask, token_type_ids=types, labels=labels).loss
    out = fe(ids, mask, types, labels=labels).loss
    assert abs(out.item() - ref.item()) <= 1e-5 * abs(ref.item()) + 1e-7
    ref.backward()
    out.backward()
    _grads_close(fe, hf)


@pytest.mark.parametrize("task", HEADS)
@pytest.mark.parametrize("arch", ARCHS)
def test_save_pretrained_round_trip(arch, tmp_path, task):
    hf = _make(arch, task, rope_parameters={"rope_type": "linear", "rope_theta": 30000.0, "factor": 2.0}, **SMALL)
    fastenc.from_hf(hf).save_pretrained(tmp_path)
    back = getattr(_hf.transformers, CLASSES[arch][task]).from_pretrained(tmp_path, attn_implementation="eager")
    ref_state = hf.state_dict()
    for k, v in back.state_dict().items():
        assert torch.equal(ref_state[k], v), k
    assert back.config.rope_parameters["rope_type"] == "linear" and back.config.rope_parameters["factor"] == 2.0
    again = fastenc.from_pretrained(tmp_path)
    assert type(again).__name__ == type(hf).__name__
    ids, mask, types = _batch(seed=11)
    with torch.no_grad():
        _check(task, again(ids, mask, types), hf(ids, attention_mask=mask, token_type_ids=types), mask)


@pytest.mark.parametrize("task,out_type", [("base", "BaseModelOutputWithPooling"),
                                           ("sequence_classification", "SequenceClassifierOutput"),
                                           ("token_classification", "TokenClassifierOutput"),
                                           ("masked_lm", "MaskedLMOutput")])
@pytest.mark.parametrize("arch", ARCHS)
def test_accelerate(arch, task, out_type):
    hf = _make(arch, task, layers=2)
    acc = fastenc.accelerate(hf)
    ids, mask, types = _hf.text_batch([9, 4, 12], seed=12)
    left = torch.stack([m.roll(int((m == 0).sum())) for m in mask])  # left padding: column 0 is padding
    for m in (mask, left):
        inp = {"input_ids": ids * m, "attention_mask": m, "token_type_ids": types * m}
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("error", FallbackWarning)
            out, fast = _hf.ran_fastenc(lambda: acc(**inp))
            ref = hf(**inp)
        assert fast and type(out).__name__ == out_type == type(ref).__name__
        if task == "sequence_classification":
            _close(out.logits, ref.logits)
        else:
            key = "last_hidden_state" if task == "base" else "logits"
            _close(getattr(out, key), getattr(ref, key), m)
            if task == "base":  # column 0 as transformers computes it, padding or not
                _close(out.last_hidden_state[:, 0], ref.last_hidden_state[:, 0])


@pytest.mark.parametrize("arch", ARCHS)
def test_accelerate_training_gradients_reach_transformers_parameters(arch):
    kw = dict(layers=2, **NO_DROP)
    hf, twin = _make(arch, "sequence_classification", **kw).train(), _make(arch, "sequence_classification", **kw)
    acc = fastenc.accelerate(twin.train())
    ids, mask, types = _batch(seed=13)
    labels = torch.tensor([0, 3, 1, 4])
    ref = hf(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        out, fast = _hf.ran_fastenc(lambda: acc(input_ids=ids, attention_mask=mask, token_type_ids=types,
                                                labels=labels))
    assert fast and abs(out.loss.item() - ref.loss.item()) <= TOL
    ref.loss.backward()
    out.loss.backward()
    mine = dict(twin.named_parameters())
    for name, p in hf.named_parameters():
        assert mine[name].grad is not None, name
        _close(mine[name].grad, p.grad, tol=1e-4)


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
@pytest.mark.parametrize("arch", ARCHS)
def test_peft_lora_adapter(arch, tmp_path, merge):
    from peft import LoraConfig, get_peft_model

    hf = _make(arch, "token_classification", **SMALL)
    pm = get_peft_model(copy.deepcopy(hf), LoraConfig(r=4, lora_alpha=8,
                                                      target_modules=list(architecture.get(arch).lora_targets)))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    pm.eval().save_pretrained(tmp_path)
    fe = fastenc.from_hf(hf)
    fe.load_lora(tmp_path, merge=merge)
    ids, mask, types = _batch(seed=14)
    with torch.no_grad():
        ref = pm(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        base = hf(ids, attention_mask=mask, token_type_ids=types).logits
    assert float((ref - base)[mask.bool()].abs().max()) > 1e-3  # the adapter changes the outputs
    _close(fe(ids, mask, types), ref, mask)


@pytest.mark.parametrize("arch", GATED)
def test_lora_on_half_of_the_fused_gate_up_projection_is_refused(arch, tmp_path):
    from peft import LoraConfig, get_peft_model

    hf = _make(arch, "base", layers=1)
    get_peft_model(copy.deepcopy(hf), LoraConfig(r=2, target_modules=["gate_proj"])).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="'layers.0.mlp.gate_proj' is one part of a fused projection"):
        fastenc.from_hf(hf).load_lora(tmp_path)


@pytest.mark.parametrize("arch", ARCHS)
def test_add_lora_default_targets_train_save_and_load_in_peft(arch, tmp_path):
    from peft import PeftModel

    hf = _make(arch, "sequence_classification", **SMALL)
    fe = fastenc.from_hf(hf).train()
    fe.add_lora(r=4, lora_alpha=8)  # the attention projections (PEFT maps no default targets for these)
    trainable = {n for n, p in fe.named_parameters() if p.requires_grad}
    assert {f"layers.0.attn.Wqkv.lora.default.lora_A.{k}" for k in "qkv"} <= trainable
    assert "layers.0.attn.Wo.lora.default.lora_A.w" in trainable
    assert not any(".mlp." in n for n in trainable)
    ids, mask, types = _batch(seed=15)
    labels = torch.tensor([1, 0, 4, 2])
    opt = torch.optim.SGD([p for p in fe.parameters() if p.requires_grad], lr=0.5)
    for _ in range(2):
        opt.zero_grad()
        fe(ids, mask, types, labels=labels).loss.backward()
        opt.step()
    fe.eval().save_lora(tmp_path)
    pm = PeftModel.from_pretrained(_make(arch, "sequence_classification", **SMALL), tmp_path).eval()
    with torch.no_grad():
        ref = pm(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        base = hf(ids, attention_mask=mask, token_type_ids=types).logits
        out = fe(ids, mask, types)
    assert float((ref - base).abs().max()) > 1e-3
    _close(out, ref)


def test_jina_question_answering_parity_and_loss():
    hf = _hf.jina_embeddings_v3("question_answering", **SMALL)
    fe = fastenc.from_hf(hf)
    ids, mask, types = _batch(seed=16)
    start, end = torch.tensor([3, 0, 30, 2]), torch.tensor([5, 0, 7, 90])  # 90: out of range, ignored
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=types, start_positions=start, end_positions=end)
        out = fe(ids, mask, types, start_positions=start, end_positions=end)
        logits = fe(ids, mask, types)
    _close(logits[0], ref.start_logits, mask)
    _close(logits[1], ref.end_logits, mask)
    assert type(out).__name__ == "QuestionAnsweringModelOutput" and abs(out.loss.item() - ref.loss.item()) <= TOL


def test_jina_task_adapters_from_the_checkpoint_folder(tmp_path):
    # The transformers checkpoint's layout: the model, and one PEFT adapter folder per task (retrieval_query, ...).
    from peft import LoraConfig, PeftModel, get_peft_model

    hf = _hf.jina_embeddings_v3("base", **SMALL)
    hf.save_pretrained(tmp_path)
    g = torch.Generator().manual_seed(17)
    for task in ("retrieval_query", "text_matching"):
        pm = get_peft_model(copy.deepcopy(hf), LoraConfig(r=4, lora_alpha=4, target_modules=["q_proj", "v_proj",
                                                                                             "o_proj", "fc1"]))
        with torch.no_grad():
            for name, p in pm.named_parameters():
                if "lora_" in name:
                    p.copy_(0.1 * torch.randn(p.shape, generator=g))
        pm.save_pretrained(tmp_path / task)
    fe = fastenc.from_pretrained(tmp_path)
    assert fe.lora_adapters["unmerged"] == ["retrieval_query", "text_matching"] and fe.lora_adapters["active"] is None
    ids, mask, _ = _batch(seed=18)
    m = mask[..., None].float()
    pm = PeftModel.from_pretrained(copy.deepcopy(hf), tmp_path / "retrieval_query", adapter_name="retrieval_query")
    pm.load_adapter(tmp_path / "text_matching", adapter_name="text_matching")
    pm.eval()
    with torch.no_grad():
        base = hf(ids, attention_mask=mask).last_hidden_state
        _close(fe.encode(ids, mask), (base * m).sum(1) / m.sum(1))  # no adapter by default: the backbone
        for task, name in (("retrieval.query", "retrieval_query"), ("text-matching", "text_matching")):
            pm.set_adapter(name)
            ref = pm(input_ids=ids, attention_mask=mask).last_hidden_state
            assert float((ref - base)[mask.bool()].abs().max()) > 1e-3
            _close(fe.encode(ids, mask, adapter=task), (ref * m).sum(1) / m.sum(1))
    with pytest.raises(ValueError, match=r"adapter 'separation' is not loaded \(loaded: \['retrieval_query', "):
        fe.encode(ids, mask, adapter="separation")
    with pytest.raises(ValueError, match="holds no task adapter folder"):
        fastenc.from_hf(hf).load_task_adapters(tmp_path / "retrieval_query")


def test_jina_original_remote_code_layout_is_refused():
    d = {**_hf.jina_embeddings_v3("base", layers=1).config.to_dict(), "lora_adaptations": ["retrieval.query"]}
    with pytest.raises(ValueError, match="lora_adaptations is the original jina-embeddings-v3 layout"):
        architecture.get("jina_embeddings_v3").config.from_dict(d)


@pytest.mark.parametrize("arch", ARCHS)
def test_checkpoints_in_transformers_saved_layout_load(arch, tmp_path):
    # transformers' save_pretrained writes these models in their original layout (fused q/k/v; GTE's
    # up_gate_proj = [up | gate], NomicBERT's fc11 = up, fc12 = gate; renamed norms): from_pretrained reads it.
    from safetensors.torch import load_file

    fused = {"gte": "attention.qkv_proj.weight", "nomic_bert": "attn.Wqkv.weight",
             "jina_embeddings_v3": "mixer.Wqkv.weight"}[arch]
    for task in CLASSES[arch]:
        folder = tmp_path / task
        hf = _make(arch, task, **SMALL)
        hf.save_pretrained(folder)
        assert any(k.endswith(fused) for k in load_file(str(folder / "model.safetensors"))), task
        fe = fastenc.from_pretrained(folder)
        assert type(fe).__name__ == type(hf).__name__
        ids, mask, types = _batch(seed=19)
        with torch.no_grad():
            ref = hf(ids, attention_mask=mask, token_type_ids=types)
            out = fe(ids, mask, types)
        if task == "question_answering":
            _close(out[0], ref.start_logits, mask)
        else:
            _check(task, out, ref, mask)


@pytest.mark.parametrize("arch", ARCHS)
def test_accelerate_honours_gradient_checkpointing(arch):
    hf = _make(arch, "token_classification", layers=3, **NO_DROP).train()
    acc = fastenc.accelerate(hf)
    ids, mask, types = _batch(seed=20)
    labels = torch.randint(0, 5, ids.shape, generator=torch.Generator().manual_seed(20)).masked_fill(mask == 0, -100)
    inp = dict(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels)

    def step():
        hf.zero_grad(set_to_none=True)
        with torch.autograd.graph.saved_tensors_hooks(lambda t: (saved.append(t.numel()), t)[1], lambda t: t):
            loss = acc(**inp).loss
        loss.backward()
        return loss.item(), {n: p.grad.clone() for n, p in hf.named_parameters() if p.grad is not None}

    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        saved = []
        loss0, g0 = step()
        plain = sum(saved)
        hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        saved = []
        (loss1, g1), ran = _hf.ran_fastenc(step)
    assert ran and sum(saved) < 0.6 * plain, (sum(saved), plain)
    assert loss0 == loss1 and g0.keys() == g1.keys()
    for n in g0:
        assert torch.allclose(g0[n], g1[n], rtol=1e-5, atol=1e-7), n


@pytest.mark.parametrize("arch", ARCHS)
def test_bf16_by_the_tolerance_rule(arch):
    dtype = torch.bfloat16
    hf = _make(arch, "base", **SMALL)
    ids, mask, types = _batch(seed=21)
    with torch.no_grad():
        ref32 = hf(ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        ref_lowp = _make(arch, "base", **SMALL).to(dtype)(ids, attention_mask=mask, token_type_ids=types)
        out = fastenc.from_hf(hf).to(dtype=dtype)(ids, mask, types)
    assert out.dtype == dtype
    m = mask.bool()
    testing.assert_close(out[m].float(), ref32[m], ref_lowp.last_hidden_state[m].float(), dtype=dtype)
