"""Drop-in acceleration of a transformers encoder: `fastenc.accelerate(hf_model)` returns a new module that is an
instance of a per-call subclass of the model's own class (same name, config, submodules, forward signature and
output type), whose forward runs the fastenc model. Nothing in transformers is patched: the original model and
its class are untouched. Calls the fastenc path cannot serve exactly (training mode, labels, inputs_embeds,
output_attentions / output_hidden_states, explicit position_ids, interpolate_pos_encoding, masked patches) go
to the original forward.
"""
from __future__ import annotations

import inspect

import torch

from fastenc.models.loading import SUPPORTED, from_hf

# Arguments the fastenc path understands; anything else set to a non-default value falls back to transformers.
_HANDLED = {"input_ids", "attention_mask", "token_type_ids", "pixel_values", "return_dict"}
_IGNORED_FALSEY = {"output_attentions", "output_hidden_states", "use_cache", "labels", "position_ids",
                   "inputs_embeds", "head_mask", "interpolate_pos_encoding", "bool_masked_pos",
                   "encoder_hidden_states", "encoder_attention_mask", "past_key_values", "cache"}


def _output_type(arch: str, task: str):
    from transformers import modeling_outputs as mo

    if task == "sequence_classification":
        return mo.SequenceClassifierOutput
    if task == "token_classification":
        return mo.TokenClassifierOutput
    if task == "image_classification":
        return mo.ImageClassifierOutput
    return {"bert": mo.BaseModelOutputWithPoolingAndCrossAttentions, "modernbert": mo.BaseModelOutput,
            "vit": mo.BaseModelOutputWithPooling}[arch]


def _fast_forward(self, *args, **kwargs):
    sig = type(self)._fastenc_signature
    bound = sig.bind(self, *args, **kwargs)
    a = dict(bound.arguments)
    a.pop("self", None)
    extra = a.pop("kwargs", {}) or {}
    a.update(extra)
    slow = self.training or any(k not in _HANDLED and k not in _IGNORED_FALSEY for k, v in a.items() if v is not None)
    slow = slow or any(a.get(k) is not None and a.get(k) is not False for k in _IGNORED_FALSEY)
    fe = self.__dict__["_fastenc"]
    if slow or fe is None:
        return type(self).__mro__[1].forward(self, *args, **kwargs)
    arch, task = type(self)._fastenc_kind
    return_dict = a.get("return_dict")
    if return_dict is None:
        return_dict = getattr(self.config, "return_dict", True)
    out_cls = _output_type(arch, task)
    if arch == "vit":
        pv = a.get("pixel_values")
        if task == "base":
            x, batch = fe(pv, return_packed=True)
            hidden = batch.pad(x)
            out = out_cls(last_hidden_state=hidden, pooler_output=fe.pool(hidden) if fe.pooler is not None else None)
        else:
            out = out_cls(logits=fe(pv))
    else:
        ids, mask, types = a.get("input_ids"), a.get("attention_mask"), a.get("token_type_ids")
        if arch == "modernbert":
            types = None
        if task == "base":
            hidden = fe(ids, mask, types)
            if arch == "bert":
                out = out_cls(last_hidden_state=hidden, pooler_output=fe.pool(hidden) if fe.pooler is not None else None)
            else:
                out = out_cls(last_hidden_state=hidden)
        else:
            out = out_cls(logits=fe(ids, mask, types))
    return out if return_dict else out.to_tuple()


def _apply(self, fn, *args, **kwargs):
    # Move / cast the transformers modules, then rebuild the fastenc model on the result (shared tensors).
    res = type(self).__mro__[1]._apply(self, fn, *args, **kwargs)
    if self.__dict__.get("_fastenc") is not None:
        self.__dict__["_fastenc"] = from_hf(self, copy=self.__dict__.get("_fastenc_copy", False))
    return res


def accelerate(hf_model, copy: bool = False):
    """Return a module behaving like `hf_model` (same forward signature and output type) running on fastenc.

    copy=False shares the weights with `hf_model` (only the fused QKV weights are new tensors).
    The returned module shares `hf_model`'s submodules: moving it with .to() moves those too.
    """
    base = type(hf_model)
    if getattr(base, "_fastenc_kind", None) is not None:
        return hf_model
    name = next((c.__name__ for c in base.__mro__ if c.__name__ in SUPPORTED), None)
    if name is None:
        from fastenc.models.loading import _unsupported
        raise _unsupported(base.__name__)
    fe = from_hf(hf_model, copy=copy)
    sig = inspect.signature(base.forward)

    def forward(self, *args, **kwargs):
        return _fast_forward(self, *args, **kwargs)

    forward.__signature__ = sig
    forward.__doc__ = base.forward.__doc__
    cls = type(base.__name__, (base,), {
        "forward": forward, "_apply": _apply, "_fastenc_kind": SUPPORTED[name], "_fastenc_signature": sig,
        "__module__": base.__module__, "__qualname__": base.__qualname__,
    })
    obj = cls.__new__(cls)
    obj.__dict__.update(hf_model.__dict__)
    for k in ("_modules", "_parameters", "_buffers", "_non_persistent_buffers_set"):
        if k in obj.__dict__:
            obj.__dict__[k] = type(obj.__dict__[k])(obj.__dict__[k])
    obj.__dict__["_fastenc"] = fe
    obj.__dict__["_fastenc_copy"] = copy
    return obj
