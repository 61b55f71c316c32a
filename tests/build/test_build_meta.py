"""Build metadata: a build for another torch/CUDA is refused with the reason, a GPU the compiled archs cannot
run makes the cuda backend unavailable with the reason, and a stale JIT build folder is cleared."""
from __future__ import annotations

import json

import torch

from fastenc import extension


def test_meta_matches_running_torch():
    assert extension.meta_mismatch(extension.build_meta(cuda=False)) is None
    assert extension.meta_mismatch(None) is None


def test_meta_mismatch_names_versions():
    meta = dict(extension.build_meta(cuda=False), torch="1.0.0")
    why = extension.meta_mismatch(meta)
    assert why is not None and "1.0.0" in why and torch.__version__ in why
    meta = dict(extension.build_meta(cuda=False), with_cuda=True, cuda="0.1")
    why = extension.meta_mismatch(meta)
    assert why is not None and "CUDA 0.1" in why


def test_arch_mismatch():
    assert extension.arch_mismatch(["80", "90"], (8, 0)) is None
    assert extension.arch_mismatch(["80", "90"], (8, 9)) is None   # sm_80 code runs on 8.x
    assert extension.arch_mismatch(["80", "90"], (9, 0)) is None
    assert extension.arch_mismatch(["90a"], (9, 0)) is None
    why = extension.arch_mismatch(["80", "90"], (12, 0))
    assert why is not None and "sm_120" in why and "FASTENC_CUDA_ARCHS" in why
    assert "sm_80 or newer" in extension.arch_mismatch(["80", "90"], (7, 5))
    assert extension.arch_mismatch(["90"], (8, 0)) is not None


def test_stale_build_folder_is_cleared(tmp_path, capsys):
    (tmp_path / "fastenc_ext.so").write_text("old")
    (tmp_path / "sub").mkdir()
    (tmp_path / extension.META_FILE).write_text(json.dumps(dict(extension.build_meta(False), torch="0.0.1")))
    extension._clear_stale_build(tmp_path)
    assert list(tmp_path.iterdir()) == []
    assert "0.0.1" in capsys.readouterr().err


def test_current_build_folder_is_kept(tmp_path):
    (tmp_path / "fastenc_ext.so").write_text("current")
    (tmp_path / extension.META_FILE).write_text(json.dumps(extension.build_meta(False)))
    extension._clear_stale_build(tmp_path)
    assert (tmp_path / "fastenc_ext.so").exists()
