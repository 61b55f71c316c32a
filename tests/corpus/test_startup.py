"""A model load (from_pretrained, and so the corpus job in a fresh process: the CLI, each Ray actor) skips the
meta-device random init that would import torch._dynamo (seconds), and loads the same weights."""
import subprocess
import sys

import pytest
import torch

from fastenc.models.loading import SkipMetaInit

_LOAD = """
import sys
from fastenc.corpus.job import load_model
m, _ = load_model()
assert "torch._dynamo" not in sys.modules, "torch._dynamo imported by the model load"
print(float(m.embeddings.word.weight.double().abs().sum()))
"""


def test_fresh_load_skips_dynamo(minilm):
    r = subprocess.run([sys.executable, "-c", _LOAD], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    # the checkpoint's weights, not an init: the same as the model loaded in this process
    assert float(r.stdout.split()[-1]) == pytest.approx(float(minilm.embeddings.word.weight.double().abs().sum()),
                                                         rel=1e-12)


def test_skip_meta_init_only_on_meta():
    cpu = torch.zeros(64)
    with SkipMetaInit():
        torch.nn.init.normal_(cpu)
        meta = torch.nn.Embedding(5, 3, device="meta")
        cpu2 = torch.zeros(64).normal_()
    assert cpu.std() > 0.5 and cpu2.std() > 0.5  # real tensors still initialized
    assert meta.weight.is_meta and tuple(meta.weight.shape) == (5, 3)
