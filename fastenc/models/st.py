"""fastenc.accelerate on a sentence-transformers model (SentenceTransformer, CrossEncoder, SparseEncoder): each of
its transformer modules (sentence_transformers' Transformer / MLMTransformer, the modules holding a transformers
model) gets its transformers model replaced by fastenc.models.hf.accelerate's module, in place, and the same
object is returned: encode() / predict() then run fastenc's encoder with the same outputs.

Where the transformers model lives depends on the installed sentence-transformers: from version 6 it is the
module's `model` attribute and `auto_model` is a read-only property returning it (assigning to `auto_model` then
does nothing: nn.Module stores the value as an extra submodule and the property still returns `model`); before 6,
`auto_model` itself. The attribute is chosen from the module's class, never guessed from the version string.
"""
from __future__ import annotations


def is_sentence_transformers(obj) -> bool:
    """Whether obj is a sentence-transformers model (a class of the sentence_transformers package, or derived)."""
    return any(c.__module__.split(".")[0] == "sentence_transformers" for c in type(obj).__mro__)


def model_attribute(module) -> str | None:
    """The attribute of a sentence-transformers module holding its transformers model ("model" where
    `auto_model` is a read-only property, else "auto_model"), or None for a module without one (pooling,
    normalization, dense layers)."""
    import torch

    prop = getattr(type(module), "auto_model", None)
    if isinstance(prop, property) and prop.fset is None:
        name = "model"
    elif "auto_model" in getattr(module, "_modules", {}) or "auto_model" in vars(module):
        name = "auto_model"
    else:
        return None
    inner = getattr(module, name, None)
    if not isinstance(inner, torch.nn.Module) or not hasattr(inner, "config"):
        return None
    return name


def accelerate(st_model, copy: bool = False):
    """Accelerate every transformer module of a sentence-transformers model in place; returns st_model.

    Every module is checked first: one whose transformers model fastenc cannot run raises (the architecture
    table's error) and nothing is changed. A model without any transformer module is refused with a ValueError."""
    from fastenc.models.hf import accelerate as accelerate_hf

    targets = []
    for module in st_model.modules():
        name = model_attribute(module)
        if name is not None:
            targets.append((module, name, getattr(module, name)))
    if not targets:
        raise ValueError(f"accelerate: {type(st_model).__name__} has no transformer module (a module holding a "
                         f"transformers model as `model` or `auto_model`) to accelerate")
    done = [(module, name, accelerate_hf(inner, copy=copy)) for module, name, inner in targets]
    for module, name, fast in done:
        setattr(module, name, fast)
    return st_model
