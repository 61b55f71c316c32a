"""save_pretrained / save_lora into a folder they cannot write: a SaveError (an OSError) naming the operation, the
folder and the OS's reason, and nothing half-written under a final file name."""
from __future__ import annotations

import errno

import pytest
import torch

import fastenc
from _train import hf_model
from fastenc.models import saving


def _model():
    return fastenc.from_hf(hf_model("bert", "base")).eval()


def _lora_model():
    fe = fastenc.from_hf(hf_model("bert", "sequence_classification"))
    fe.add_lora(r=2, lora_alpha=4, target_modules=["query", "value"])
    return fe


@pytest.mark.parametrize("op", ["save_pretrained", "save_lora"])
def test_folder_under_a_file(op, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    folder = blocker / "out"
    model = _model() if op == "save_pretrained" else _lora_model()
    with pytest.raises(saving.SaveError) as info:
        getattr(model, op)(folder)
    msg = str(info.value)
    assert msg.startswith(f"{op}: cannot write"), msg
    assert str(folder) in msg and ("Not a directory" in msg or "File exists" in msg), msg
    assert isinstance(info.value, OSError) and info.value.errno in (errno.ENOTDIR, errno.EEXIST)
    assert blocker.read_text() == "not a folder"


@pytest.mark.parametrize("op,weights", [("save_pretrained", "model.safetensors"),
                                        ("save_lora", "adapter_model.safetensors")])
def test_failed_write_leaves_no_partial_file(op, weights, tmp_path, monkeypatch):
    # the disk fills up half-way through the weights: the earlier save stays whole, no temporary file is left
    model = _model() if op == "save_pretrained" else _lora_model()
    folder = getattr(model, op)(tmp_path / "out")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    import safetensors.torch

    def full_disk(tensors, path, metadata=None):
        with open(path, "wb") as f:
            f.write(b"\0" * 100)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    with pytest.raises(saving.SaveError, match=rf"{op}: cannot write {weights} into .*out: No space left on device"):
        getattr(model, op)(folder)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before  # (no .tmp files, nothing replaced)


def test_safetensors_error_is_named(tmp_path, monkeypatch):
    # safetensors' own error type (not an OSError) on a failed write is reported the same way
    import safetensors.torch
    from safetensors import SafetensorError

    def fail(tensors, path, metadata=None):
        raise SafetensorError("Error while serializing: I/O error: Read-only file system (os error 30)")

    monkeypatch.setattr(safetensors.torch, "save_file", fail)
    with pytest.raises(saving.SaveError, match=r"save_pretrained: cannot write model.safetensors into .*: Error "
                                               r"while serializing: I/O error: Read-only file system"):
        _model().save_pretrained(tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []
