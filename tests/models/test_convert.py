"""Weight maps both ways, from_pretrained on a local folder (safetensors, .bin, legacy names), bad input."""
from __future__ import annotations

import json

import pytest
import torch

import fastenc
import _models_hf as _hf
from fastenc.models import architecture, convert
from fastenc.models.loading import SUPPORTED

# Every head of every registered architecture, on its tiny_config (declared in its model file).
CASES = [(a, t) for a, spec in architecture.architectures().items() for t in spec.heads]


def _make(arch, task):
    small = dict(layers=1, image=32, patch=8) if architecture.get(arch).modality == "vision" else dict(layers=2)
    return architecture.get(arch).tiny_model(task, **small)


def test_every_architecture_has_a_test_factory():
    for name, arch in architecture.architectures().items():
        assert arch.tiny_config is not None, name
        assert getattr(_hf, name.replace("-", "_"))().config.model_type == name  # (the factory _models_hf derives)


@pytest.mark.parametrize("arch,task", CASES, ids=[f"{a}-{t}" for a, t in CASES])
def test_weight_map_round_trip(arch, task):
    hf = _make(arch, task)
    fe = fastenc.from_hf(hf)
    entries = architecture.get(arch).entries(fe.config, task)
    # every fastenc tensor is covered exactly once, and mapping back restores every HF tensor
    assert sorted(e[0] for e in entries) == sorted(fe.state_dict())
    back = convert.fastenc_to_hf(entries, fe.state_dict(), fe.config)
    # the checkpoint's tensors: a tied alias (the masked-LM decoder weight) is the same tensor as its source,
    # which save_pretrained stores once
    tied = getattr(hf, "all_tied_weights_keys", None) or {}
    hf_state = {k: v for k, v in hf.state_dict().items() if k not in tied}
    full = hf.state_dict()
    assert all(full[k].data_ptr() == full[src].data_ptr() for k, src in tied.items())
    assert set(back) == set(hf_state)
    # a "scale" entry (DINOv2's layer scale folded into a projection) is a product divided back: one rounding each
    # way, so within two ulps rather than bit for bit
    scaled = {e[0] for e in entries if e[2] == "scale"} | {e[1][0] for e in entries if e[2] == "scale"}
    for k, v in back.items():
        assert _same(v, hf_state[k], k in scaled), k
    again = convert.hf_to_fastenc(entries, back, fe.config)
    for k, v in fe.state_dict().items():
        assert _same(again[k], v, k in scaled), k


def _same(a: torch.Tensor, b: torch.Tensor, ulps: bool) -> bool:
    if not ulps:
        return torch.equal(a, b)
    return a.shape == b.shape and bool(((a - b).abs() <= 2 * torch.finfo(b.dtype).eps * b.abs()).all())


def test_fused_qkv_layout():
    hf = _hf.bert()
    fe = fastenc.from_hf(hf)
    sa = hf.encoder.layer[1].attention.self
    w = fe.layers[1].attn.Wqkv.weight
    assert torch.equal(w, torch.cat([sa.query.weight, sa.key.weight, sa.value.weight]))
    assert fastenc.from_hf(hf, copy=False).layers[0].mlp.fc1.weight.data_ptr() == \
        hf.encoder.layer[0].intermediate.dense.weight.data_ptr()
    assert fe.layers[0].mlp.fc1.weight.data_ptr() != hf.encoder.layer[0].intermediate.dense.weight.data_ptr()


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
@pytest.mark.parametrize("arch,task", [("bert", "sequence_classification"), ("modernbert", "base"),
                                       ("vit", "image_classification")], ids=["bert-seqcls", "modernbert", "vit-cls"])
def test_from_pretrained_folder(tmp_path, arch, task, fmt):
    hf = _make(arch, task)
    hf.save_pretrained(tmp_path)
    if fmt == "bin":  # the older pickle format, as many checkpoints still ship
        from safetensors.torch import load_file
        torch.save(load_file(str(tmp_path / "model.safetensors")), tmp_path / "pytorch_model.bin")
        (tmp_path / "model.safetensors").unlink()
    fe = fastenc.from_pretrained(tmp_path)
    assert type(fe).__name__ == type(hf).__name__ and fe.task == task
    ref_fe = fastenc.from_hf(hf)
    for k, v in ref_fe.state_dict().items():
        assert torch.equal(fe.state_dict()[k], v), k


def test_legacy_vit_checkpoint_names(tmp_path):
    hf = _make("vit", "base")
    state = {}
    for k, v in hf.state_dict().items():  # write the pre-5.x layout
        k = (k.replace("layers.", "encoder.layer.").replace("attention.q_proj", "attention.attention.query")
             .replace("attention.k_proj", "attention.attention.key").replace("attention.v_proj", "attention.attention.value")
             .replace("attention.o_proj", "attention.output.dense").replace("mlp.fc1", "intermediate.dense")
             .replace("mlp.fc2", "output.dense"))
        state[k] = v.contiguous()
    from safetensors.torch import save_file
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({**hf.config.to_dict(), "architectures": ["ViTModel"]}))
    fe = fastenc.from_pretrained(tmp_path)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ref = hf(x).last_hidden_state
    assert float((fe(x) - ref).abs().max()) <= 1e-4


def test_unsupported_architecture_lists_supported(tmp_path):
    with pytest.raises(ValueError, match="supported: BertModel.*ViTForImageClassification"):
        fastenc.from_hf(torch.nn.Linear(2, 2))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    with pytest.raises(ValueError, match="GPT2LMHeadModel.*supported: "):
        fastenc.from_pretrained(tmp_path)
    assert {"BertModel", "ModernBertForTokenClassification", "ViTForImageClassification"} <= set(SUPPORTED)
    assert dict(SUPPORTED) == architecture.hf_classes()


def test_architecture_table_declares_every_head():
    for model_type, spec in architecture.architectures().items():
        assert spec.model_type == model_type and spec.config.from_dict
        for task, (cls, hf_name) in spec.heads.items():
            assert cls.task == task and SUPPORTED[hf_name] == (model_type, task)
    with pytest.raises(ValueError, match="unsupported model_type 'gpt2'; supported: bert, modernbert, vit"):
        architecture.get("gpt2")
    with pytest.raises(ValueError, match="unsupported head 'masked_lm'.*supported: base, image_classification"):
        architecture.get("vit").model_class("masked_lm")


def test_missing_or_corrupt_weights(tmp_path):
    hf = _make("bert", "base")
    hf.save_pretrained(tmp_path)
    st = tmp_path / "model.safetensors"
    data = st.read_bytes()
    st.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="cannot read weights from .*model.safetensors"):
        fastenc.from_pretrained(tmp_path)
    st.unlink()
    with pytest.raises(FileNotFoundError, match="no weights"):
        fastenc.from_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="not a directory"):
        fastenc.from_pretrained(tmp_path / "nope")
    # a checkpoint lacking tensors names them and loads nothing
    from safetensors.torch import save_file
    state = {k: v.contiguous() for k, v in hf.state_dict().items() if "layer.1.output" not in k}
    save_file(state, str(st))
    with pytest.raises(ValueError, match=r"missing weights: \['encoder.layer.1.output.dense.weight'"):
        fastenc.from_pretrained(tmp_path)
    # a checkpoint with more layers than its config: the unread layer is named; another head's tensors and saved
    # buffers are not an error
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    state["encoder.layer.2.output.dense.weight"] = state["encoder.layer.1.output.dense.weight"].clone()
    save_file(state, str(st))
    with pytest.raises(ValueError, match=r"unexpected weights \['encoder.layer.2.output.dense.weight'\].*"
                                         r"num_hidden_layers"):
        fastenc.from_pretrained(tmp_path)
    del state["encoder.layer.2.output.dense.weight"]
    state["embeddings.position_ids"] = torch.arange(160)[None]
    state["cls.predictions.bias"] = torch.zeros(211)
    save_file(state, str(st))
    assert fastenc.from_pretrained(tmp_path).config.num_hidden_layers == 2


def test_bad_text_inputs():
    fe = fastenc.from_hf(_hf.bert())
    ids, mask, _ = _hf.text_batch([5, 3])
    with pytest.raises(ValueError, match=r"input_ids must be in \[0, 211\)"):
        fe(ids + 500)
    with pytest.raises(ValueError, match="input_ids must be in"):
        fe(ids - 10)
    with pytest.raises(ValueError, match="exceeds the position table .*160"):
        fe(torch.ones(1, 161, dtype=torch.long))
    with pytest.raises(ValueError, match=r"attention_mask must have input_ids' shape \(2, 5\), got \(2, 4\)"):
        fe(ids, mask[:, :4])
    with pytest.raises(TypeError, match="input_ids must be an integer tensor"):
        fe(ids.float())
    with pytest.raises(ValueError, match="token_type_ids must be in"):
        fe(ids, mask, torch.full_like(ids, 7))
    mb = fastenc.from_hf(_hf.modernbert(layers=1))
    with pytest.raises(ValueError, match="exceeds the position table"):
        mb(torch.ones(1, 513, dtype=torch.long))


def test_bad_images():
    fe = fastenc.from_hf(_make("vit", "base"))
    with pytest.raises(ValueError, match=r"pixel_values must be \(batch, 3, 32, 32\), got shape \(1, 3, 48, 48\)"):
        fe(torch.randn(1, 3, 48, 48))
    with pytest.raises(ValueError, match=r"got shape \(2, 1, 32, 32\)"):
        fe(torch.randn(2, 1, 32, 32))
    with pytest.raises(TypeError, match="pixel_values must be a float tensor"):
        fe(torch.zeros(1, 3, 32, 32, dtype=torch.uint8))


def test_wrong_shaped_weights_are_named():
    hf = _make("bert", "base")
    hf.encoder.layer[1].attention.self.query.weight = torch.nn.Parameter(torch.randn(60, 64))
    with pytest.raises(ValueError, match=r"weight encoder.layer.1.attention.self.query.weight must have shape "
                                         r"\(64, 64\), got \(60, 64\)"):
        fastenc.from_hf(hf)
    hf = _make("bert", "base")
    hf.encoder.layer[0].attention.self.value.bias = torch.nn.Parameter(torch.randn(65))
    with pytest.raises(ValueError, match=r"encoder.layer.0.attention.self.value.bias must have shape \(64,\), got \(65,\)"):
        fastenc.from_hf(hf)
    hf = _make("bert", "base")
    hf.encoder.layer[0].output.dense.weight = torch.nn.Parameter(torch.randn(64, 100))
    with pytest.raises(ValueError, match=r"weight encoder.layer.0.output.dense.weight must have shape \(64, 136\), "
                                         r"got \(64, 100\)"):
        fastenc.from_hf(hf)


def test_bad_config_json_is_named(tmp_path):
    hf = _make("bert", "base")
    hf.save_pretrained(tmp_path)
    cfg = tmp_path / "config.json"
    d = json.loads(cfg.read_text())
    cfg.write_text(json.dumps([d]))
    with pytest.raises(ValueError, match=r"config.json must hold a JSON object \(a config\), got a list"):
        fastenc.from_pretrained(tmp_path)
    cfg.write_text(json.dumps({**d, "architectures": "BertModel"}))
    with pytest.raises(ValueError, match=r"config.json: architectures must be a list of class names, got 'BertModel'"):
        fastenc.from_pretrained(tmp_path)
    cfg.write_text("{\"architectures\": [")
    with pytest.raises(ValueError, match="config.json is not valid JSON"):
        fastenc.from_pretrained(tmp_path)


def test_corrupt_tokenizer_files_are_named(tmp_path):
    hf = _make("bert", "base")
    hf.save_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{\"version\": \"1.0\", \"model\": 42}")
    with pytest.raises(ValueError, match=r"cannot read .*tokenizer.json"):
        fastenc.from_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").unlink()
    (tmp_path / "modules.json").write_text("[{\"type\": ")
    with pytest.raises(ValueError, match=r"modules.json is not valid JSON"):
        fastenc.from_pretrained(tmp_path)
    (tmp_path / "modules.json").write_text("{\"type\": \"Normalize\"}")
    with pytest.raises(ValueError, match=r"modules.json must hold a JSON list, got a dict"):
        fastenc.from_pretrained(tmp_path)


def test_empty_inputs_are_refused():
    fe = fastenc.from_hf(_hf.bert())
    with pytest.raises(ValueError, match=r"input_ids must hold at least one sequence of at least one token .*"
                                         r"got shape \(0, 5\)"):
        fe(torch.zeros(0, 5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"got shape \(2, 0\)"):
        fe(torch.zeros(2, 0, dtype=torch.long))
    mb = fastenc.from_hf(_hf.modernbert(layers=1))
    with pytest.raises(ValueError, match=r"ModernBertModel: input_ids must hold at least one sequence"):
        mb(torch.zeros(0, 3, dtype=torch.long))
    vit = fastenc.from_hf(_make("vit", "base"))
    with pytest.raises(ValueError, match=r"pixel_values must hold at least one image .*got shape \(0, 3, 32, 32\)"):
        vit(torch.zeros(0, 3, 32, 32))


def _shard(tmp_path, hf):
    from safetensors.torch import save_file
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    keys = sorted(state)
    half = len(keys) // 2
    wmap = {}
    for name, part in (("model-00001-of-00002.safetensors", keys[:half]),
                       ("model-00002-of-00002.safetensors", keys[half:])):
        save_file({k: state[k] for k in part}, str(tmp_path / name))
        wmap.update({k: name for k in part})
    (tmp_path / "model.safetensors").unlink()
    return wmap


def test_sharded_checkpoint_and_path_traversal(tmp_path):
    hf = _make("bert", "base")
    folder = tmp_path / "m"
    hf.save_pretrained(folder)
    wmap = _shard(folder, hf)
    idx = folder / "model.safetensors.index.json"
    idx.write_text(json.dumps({"metadata": {}, "weight_map": wmap}))
    fe = fastenc.from_pretrained(folder)
    for k, v in fastenc.from_hf(hf).state_dict().items():
        assert torch.equal(fe.state_dict()[k], v), k
    outside = tmp_path / "x.safetensors"
    (folder / "model-00002-of-00002.safetensors").rename(outside)
    for bad in ("../x.safetensors", str(outside)):
        idx.write_text(json.dumps({"weight_map": {k: (bad if "2-of" in f else f) for k, f in wmap.items()}}))
        with pytest.raises(ValueError, match=rf"names the shard '{bad}', which is not a file inside the model folder"):
            fastenc.from_pretrained(folder)


def test_zero_labels_checkpoint():
    # transformers writes num_labels=0 as id2label={} (no num_labels key): an identity head, no classifier tensors
    hf = _hf.vit("image_classification", layers=1, image=32, patch=8)
    cfg = hf.config
    cfg.num_labels = 0
    hf = _hf._init(type(hf)(cfg), 0)
    assert cfg.to_dict()["id2label"] == {}
    fe = fastenc.from_hf(hf)
    assert fe.config.num_labels == 0
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ref = hf(x).logits
    with torch.no_grad():
        out = fe(x)
    assert out.shape == ref.shape and float((out - ref).abs().max()) <= 1e-4
