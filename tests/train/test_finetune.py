"""The fine-tuning example (`fastenc finetune`) in a tiny mode: the labelled docstring set, a training step with a
finite loss, the save in transformers' layout with the tokenizer (full; LoRA: after merge_and_unload) and PEFT's
(LoRA) reloaded there and in fastenc with equal logits."""
from __future__ import annotations

import math

import pytest

from fastenc import finetune


def test_labelled_passages_are_balanced_and_seeded():
    texts, labels = finetune.labelled_passages(per_class=5, seed=0)
    assert sorted(labels) == sorted(list(range(len(finetune.PACKAGES))) * 5)
    assert all(isinstance(t, str) and len(t) >= 40 for t in texts)
    assert (texts, labels) == finetune.labelled_passages(per_class=5, seed=0)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_tiny_finetune_saves_and_reloads(tmp_path, lora):
    res = finetune.finetune(lora=lora, out=tmp_path, epochs=1, per_class=4, batch_size=16, max_length=16,
                            progress=False, log=lambda msg: None)
    assert len(res["losses"]) == 1 and all(math.isfinite(x) for x in res["losses"])
    assert res["reload_max_diff"] < 1e-4
    saved = {p.name for p in tmp_path.iterdir()}
    model = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.txt"}
    if lora:
        assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "merged"} <= saved
        saved = {p.name for p in (tmp_path / "merged").iterdir()}
    assert model <= saved  # a folder AutoTokenizer, transformers and fastenc.from_pretrained load (reload_max_diff)


def test_cli_rejects_bad_counts(capsys):
    from fastenc import cli

    assert cli.main(["finetune", "--epochs", "0"]) == 2
    assert "--epochs must be an integer >= 1, got 0" in capsys.readouterr().err
