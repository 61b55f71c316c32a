"""Small random-weight transformers models shared by the model tests (eager attention as the reference), derived
from the architecture table: for every registered architecture a factory named after its model_type ("-" as
"_"): bert(task="base", seed=0, **kw), modernbert(...), xlm_roberta(...), ..., that is
Architecture.tiny_model (its tiny_config in the architecture's model file), and <NAME>_CLASSES (task ->
transformers class name)."""
from __future__ import annotations

import functools

import torch

from fastenc.models.architecture import architectures, random_init

transformers = __import__("transformers")
_init = random_init


def _factory(arch):
    def make(task="base", seed=0, **kw):
        return arch.tiny_model(task, seed, **kw)

    return functools.update_wrapper(make, arch.tiny_config)


for _arch in architectures().values():
    _name = _arch.model_type.replace("-", "_")
    globals()[_name] = _factory(_arch)
    globals()[f"{_name.upper()}_CLASSES"] = {task: cls for task, (_, cls) in _arch.heads.items()}


def text_batch(lengths, seq=None, vocab=211, seed=0):
    """Right-padded random ids and mask for the given lengths."""
    g = torch.Generator().manual_seed(seed)
    seq = seq or max(lengths)
    ids = torch.randint(3, vocab, (len(lengths), seq), generator=g)
    mask = torch.zeros(len(lengths), seq, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    ids = ids * mask  # pad id 0 at padded positions
    types = torch.randint(0, 2, (len(lengths), seq), generator=g) * mask
    return ids, mask, types



def roberta_batch(lengths, seq=None, vocab=211, seed=0):
    """Right-padded random ids (pad id 1 at padded positions, <s> = 0 first, no pad id among real tokens)."""
    ids, mask, _ = text_batch(lengths, seq, vocab, seed)
    ids = torch.where(mask.bool(), ids, torch.ones_like(ids))
    ids[:, 0] = 0
    return ids, mask


# Ops that only fastenc's encoder runs: attention (every layer but a first-token head's last one, which attends
# from its first rows in plain PyTorch) and the norms (every layer).
FASTENC_ENCODER_OPS = frozenset({"fastenc::attention", "fastenc::attention_qkv", "fastenc::layer_norm",
                                 "fastenc::rms_norm"})


def ran_fastenc(fn):
    """(fn(), whether fastenc's encoder ran during the call rather than transformers' own forward)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = fn()
    return out, any(e.key in FASTENC_ENCODER_OPS for e in prof.key_averages())


def image_classifier_step(hf, cls_name: str, x, num_labels: int, seed: int, close):
    """fastenc.from_hf(hf) in train mode (asserted to be `cls_name`) and transformers' image classifier `hf` on
    images x with labels (class ids when num_labels > 1, regression targets at 1; torch.Generator seed), their
    outputs' types, logits and losses held to each other by close(out, ref); then both losses backward.
    Returns (fe, ref, out)."""
    import fastenc

    hf.train()
    fe = fastenc.from_hf(hf).train()
    assert type(fe).__name__ == cls_name
    g = torch.Generator().manual_seed(seed)
    n = x.shape[0]
    labels = torch.randint(0, 3, (n,), generator=g) if num_labels > 1 else torch.randn(n, generator=g)
    ref, out = hf(x, labels=labels), fe(x, labels=labels)
    assert type(out) is type(ref)
    close(out.logits, ref.logits)
    close(out.loss, ref.loss)
    ref.loss.backward()
    out.loss.backward()
    return fe, ref, out
