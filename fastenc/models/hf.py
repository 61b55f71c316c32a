"""Drop-in acceleration of a transformers encoder: `fastenc.accelerate(hf_model)` returns a new module that is an
instance of a per-call subclass of the model's own class (same name, config, submodules, forward signature and
output type), whose forward runs the fastenc model. Nothing in transformers is patched: the original model and
its class are untouched.

Inference and training: the parameters stay transformers' own (the optimizer, state_dict and save_pretrained see
them). A call that records gradients runs the fastenc model on those very tensors (the fused QKV weight is the
concatenation of query, key and value, made per call, so gradients reach transformers' parameters); a call
without gradients runs on the fastenc model's own tensors, shared with transformers', the fused QKV weights
refreshed whenever transformers' changed (an optimizer step, load_state_dict). model.train() turns on the
dropouts, labels= gives the loss (fastenc.models.losses), num_items_in_batch (from Trainer) is used where
transformers' loss uses it (ViT, ModernBERT's masked-LM and question-answering heads) and ignored where it does
not (BERT, ModernBERT's classification heads). Masked-LM heads return transformers' logits shapes with labels too
(their hf_forward: every token, or the labelled ones under ModernBERT's sparse_prediction).

A call the fastenc path cannot serve exactly runs the original forward and says why, once per reason and
model, with a `FallbackWarning`: inputs_embeds, output_attentions / output_hidden_states (argument or config),
explicit position_ids, a mask that is not (batch, seq), ViT's interpolate_pos_encoding / bool_masked_pos /
attention_mask, labels on a base model, left padding the padded column-0 query cannot be computed for (below), and
gradient checkpointing in training on an architecture whose fastenc layers cannot recompute themselves (ModernBERT,
ViT, DeiT). On the others (BERT, RoBERTa, XLM-RoBERTa, ELECTRA, DistilBERT, GTE, NomicBERT,
Jina-v3) gradient_checkpointing_enable() is honoured: each layer transformers checkpoints is checkpointed in
fastenc's layer loop the same way.

A two-tower model (CLIPModel, SiglipModel) returns CLIPOutput / SiglipOutput (the loss with return_loss=True),
and its get_text_features / get_image_features run on fastenc too (transformers' BaseModelOutputWithPooling, the
embedding as pooler_output), falling back the same way.

Outputs follow transformers where they are defined by it: poolers and CLS pooling read column 0 even when it is
padding (a padded query over the row's real tokens, computed by fastenc.models.columns), so left-padded batches
give transformers' pooled output. Hidden states and token logits at other padded positions are zeros. A
token-classification or masked-LM label other than -100 on a padded position is refused with a ValueError (its
collators put -100 there; transformers would count it through the padded token's logits).
"""
from __future__ import annotations

import contextlib
import inspect
import warnings

import torch

from fastenc.layers.steps import optimizer_steps
from fastenc.models import architecture, convert, losses, multiple_choice
from fastenc.models.loading import SUPPORTED, from_hf
from fastenc.quant import model as quant_model

# The arguments the fastenc path understands are each architecture's `inputs` plus its head's label arguments
# (fastenc.models.architecture); any other set to a value other than None/False falls back to transformers (with
# a warning naming it).
_WHY = {"labels": "labels= on a base model (no head, no loss) is not supported",
        "inputs_embeds": "inputs_embeds is not supported",
        "position_ids": "explicit position_ids are not supported",
        "attention_mask": "attention_mask (ViT) is not supported"}


class FallbackWarning(UserWarning):
    """A call to a module made by fastenc.accelerate ran on the transformers forward (the message says why)."""


_HEAD_OUTPUT = {"sequence_classification": "SequenceClassifierOutput", "token_classification": "TokenClassifierOutput",
                "question_answering": "QuestionAnsweringModelOutput", "masked_lm": "MaskedLMOutput",
                "image_classification": "ImageClassifierOutput", "multiple_choice": "MultipleChoiceModelOutput"}


def _output_type(arch: str, task: str):
    import importlib

    from transformers import modeling_outputs as mo

    spec = architecture.get(arch)
    if task in spec.head_outputs:
        module, _, name = spec.head_outputs[task].partition(":")
        return getattr(importlib.import_module(module), name)
    return getattr(mo, _HEAD_OUTPUT.get(task) or spec.base_output)


def _needs_column0(arch: str, task: str, fe) -> bool:
    """Whether the call's output reads column 0 (the base model's pooler, a CLS-pooled classification head)."""
    if task not in ("base", "sequence_classification") or architecture.get(arch).modality != "text":
        return False
    if not getattr(fe, "pools_column0", True):  # (CLIP's text tower pools its EOS token: its hf_forward)
        return False
    return not (task == "sequence_classification" and getattr(fe.config, "classifier_pooling", "cls") == "mean")


def _left_padding_reasons(arch: str, fe, mask) -> list[str]:
    """Left-padded rows whose padded column-0 query transformers computes over no visible key (its masked softmax
    is then uniform over the padding): not served."""
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2 or mask.shape[1] == 0:
        return []
    m = mask.bool()
    if bool(m[:, 0].all()):
        return []
    if not bool(m.any(1).all()):
        return ["a row of attention_mask has no real token (its pooled column 0 sees no key)"]
    if any(getattr(layer.attn, "window", None) is not None for layer in fe.layers):
        half = min(layer.attn.window[1] for layer in fe.layers if layer.attn.window is not None)
        first = m.int().argmax(1)
        if bool((first > half).any()):
            return [f"left padding longer than half the local window ({half} columns): the padded column-0 "
                    f"query sees no key in the local layers"]
    return []


def _reasons(self, a: dict, arch: str) -> list[str]:
    """Why the fastenc path cannot serve this call exactly (empty: it can)."""
    out = []
    handled = architecture.get(arch).inputs | set(architecture.LABEL_ARGS[type(self)._fastenc_kind[1]])
    for k, v in a.items():
        if k in handled or v is None or v is False:
            continue
        out.append(_WHY.get(k) or (f"{k}={v!r} is not supported" if isinstance(v, (bool, int, float, str))
                                   else f"argument {k!r} is not supported"))
    for flag in ("output_attentions", "output_hidden_states"):
        if a.get(flag) is None and getattr(self.config, flag, False):
            out.append(f"config.{flag}=True is not supported")
    if _checkpoint_flags(self) is not None and not all(hasattr(layer, "checkpoint_func")
                                                        for layer in self.__dict__["_fastenc"].layers):
        out.append(f"gradient checkpointing (gradient_checkpointing_enable()) is not supported for {arch} in "
                   f"training")
    mask = a.get("attention_mask")
    text = "text" in architecture.get(arch).modalities
    dims = 3 if type(self)._fastenc_kind[1] == "multiple_choice" else 2  # (batch, choices, seq) there
    if text and mask is not None and (not isinstance(mask, torch.Tensor) or mask.dim() != dims):
        out.append(f"attention_mask of shape {tuple(getattr(mask, 'shape', ()))} is not supported (only "
                   f"{'(batch, choices, seq)' if dims == 3 else '(batch, seq)'})")
    elif text and _needs_column0(arch, type(self)._fastenc_kind[1], self.__dict__["_fastenc"]):
        out += _left_padding_reasons(arch, self.__dict__["_fastenc"], mask)
    elif text and dims == 3 and not getattr(self.__dict__["_fastenc"], "serves_empty_choices", True):
        if multiple_choice.empty_choice(mask) is not None:
            out.append("a choice of attention_mask has no real token (transformers scores it from uniform attention "
                       "over the padding)")
    return out


def _checkpoint_flags(self) -> list[tuple[bool, object]] | None:
    """Per fastenc layer, (checkpointed, the checkpoint function) as transformers' gradient_checkpointing_enable()
    set them on its layers (every_n_layers: per layer; when its layers do not map one to one, all of them), or None
    when this call does not checkpoint (flag off, eval mode or no autograd recording: transformers' layers then
    do not checkpoint either)."""
    if not (self.training and torch.is_grad_enabled()):
        return None
    if not any(getattr(m, "gradient_checkpointing", False) is True for m in self.modules()):
        return None
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:  # (older transformers: no per-layer class)
        GradientCheckpointingLayer = ()
    marked = [m for m in self.modules() if isinstance(m, GradientCheckpointingLayer)]
    n = len(self.__dict__["_fastenc"].layers)
    if len(marked) == n:
        return [(bool(m.gradient_checkpointing), getattr(m, "_gradient_checkpointing_func", None)) for m in marked]
    func = next((getattr(m, "_gradient_checkpointing_func", None) for m in self.modules()
                 if getattr(m, "gradient_checkpointing", False)), None)
    return [(True, func)] * n


def _warn(self, reasons: list[str]) -> None:
    seen = self.__dict__.setdefault("_fastenc_warned", set())
    for r in reasons:
        if r not in seen:
            seen.add(r)
            warnings.warn(f"fastenc.accelerate({type(self).__name__}): {r}; running the transformers forward",
                          FallbackWarning, stacklevel=6)  # (the caller of the module)


def _fast_forward(self, *args, **kwargs):
    sig = type(self)._fastenc_signature
    bound = sig.bind(self, *args, **kwargs)
    a = dict(bound.arguments)
    a.pop("self", None)
    extra = a.pop("kwargs", {}) or {}
    a.update(extra)
    arch, task = type(self)._fastenc_kind
    reasons = _reasons(self, a, arch)
    if reasons:
        _warn(self, reasons)
        return type(self).__mro__[1].forward(self, *args, **kwargs)
    fe = self.__dict__["_fastenc"]
    if fe.training != self.training:
        fe.train(self.training)
    return_dict = a.get("return_dict")
    if return_dict is None:
        return_dict = getattr(self.config, "return_dict", True)
    flags = _checkpoint_flags(self)
    for i, layer in enumerate(fe.layers):
        if hasattr(layer, "checkpoint_func"):
            layer.gradient_checkpointing, layer.checkpoint_func = (False, None) if flags is None else flags[i]
    with _weights(self, fe):
        out = _run(self, fe, arch, task, a)
    if task != "base" and getattr(out, "loss", None) is not None and hasattr(fe.config, "problem_type"):
        self.config.problem_type = getattr(fe.config, "problem_type", None) or self.config.problem_type
    return out if return_dict else out.to_tuple()


def _run(self, fe, arch: str, task: str, a: dict):
    """The fastenc forward of one call, as transformers' output type (labels checked before any work).

    A head's forward takes the architecture's text inputs (or pixel_values) and its label arguments
    (architecture.LABEL_ARGS) and returns its logits (a (start, end) pair for question answering), or
    transformers' output with the loss when labels are given. A head whose transformers output holds more than
    that defines `hf_forward` (same arguments) returning a dict of the output's fields. The base model and CLS-pooled sequence
    classification read column 0 as transformers does (fe._run(..., column0=True), fe.classify, fe.pooler)."""
    out_cls = _output_type(arch, task)
    spec = architecture.get(arch)
    labels = {k: a[k] for k in architecture.LABEL_ARGS[task] if a.get(k) is not None}
    if spec.modality == "text+vision":
        return _run_two_towers(fe, task, out_cls, a, labels)
    if spec.modality == "vision":
        pv = a.get("pixel_values")
        if task == "base":
            extra = {"interpolate_pos_encoding": True} if a.get("interpolate_pos_encoding") else {}
            x, batch = fe(pv, return_packed=True, **extra)  # (interpolate_pos_encoding: where `inputs` has it)
            hidden = batch.pad(x)
            pooled = (fe.pooler_output(hidden) if hasattr(fe, "pooler_output")
                      else fe.pool(hidden) if fe.pooler is not None else None)
            return out_cls(last_hidden_state=hidden, pooler_output=pooled)
        if labels:
            return fe(pv, **labels, num_items_in_batch=a.get("num_items_in_batch"))
        return _wrap(out_cls, task, getattr(fe, "hf_forward", fe)(pv))
    ids, mask, types = a.get("input_ids"), a.get("attention_mask"), a.get("token_type_ids")
    text = (ids, mask, types) if spec.token_types else (ids, mask)
    if not _needs_column0(arch, task, fe):
        if labels and hasattr(fe, "hf_forward"):  # (a head whose transformers output with labels differs from fe's)
            return _wrap(out_cls, task, fe.hf_forward(*text, **labels, num_items_in_batch=a.get("num_items_in_batch")))
        if labels and "num_items_in_batch" in inspect.signature(fe.forward).parameters:
            labels["num_items_in_batch"] = a.get("num_items_in_batch")
        return fe(*text, **labels) if labels else _wrap(out_cls, task, getattr(fe, "hf_forward", fe)(*text))
    # column 0 as transformers reads it, padding or not
    kind = None
    if labels:
        kind = losses.check_sequence_labels(type(self).__name__, fe.config, labels["labels"], losses.grid(ids)[0])
    if task == "sequence_classification" and (labels or torch.is_grad_enabled()) and _column0_real(mask):
        first, _, _ = fe._run(*text, first_only=True)  # (column 0 is each row's first token: the last layer there only)
    else:
        x, batch, first = fe._run(*text, column0=True)
    if task == "sequence_classification":
        logits = fe.classify(first)
        loss = None if kind is None else losses.sequence_loss(fe.config, kind, logits, labels["labels"])
        return out_cls(loss=loss, logits=logits)
    hidden = batch.pad(x)
    if batch.indices is not None:  # (a new tensor: padding was re-inserted)
        hidden[:, 0] = first
    if "pooler_output" in out_cls.__dataclass_fields__:
        pooler = getattr(fe, "pooler", None)
        return out_cls(last_hidden_state=hidden, pooler_output=torch.tanh(pooler(first)) if pooler is not None else None)
    return out_cls(last_hidden_state=hidden)


def _run_two_towers(fe, task: str, out_cls, a: dict, labels: dict):
    """A two-tower model's call (CLIPModel, SiglipModel: CLIPOutput / SiglipOutput with each tower's
    BaseModelOutputWithPooling) or its image classifier's (ImageClassifierOutput)."""
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    pv = a.get("pixel_values")
    interp = {"interpolate_pos_encoding": True} if a.get("interpolate_pos_encoding") else {}
    if task == "image_classification":
        return fe(pv, **labels, **interp) if labels else out_cls(logits=fe(pv, **interp))
    out = fe(a.get("input_ids"), pv, a.get("attention_mask"), return_loss=bool(a.get("return_loss")), **interp)
    fields = out._asdict()
    for k in ("text_model_output", "vision_model_output"):
        fields[k] = BaseModelOutputWithPooling(**fields[k]._asdict())
    return out_cls(**fields)


def _fast_features(self, kind: str, *args, **kwargs):
    """get_text_features / get_image_features of an accelerated two-tower model: the tower on fastenc, as
    transformers' BaseModelOutputWithPooling (pooler_output: the embedding), or transformers' own method (with a
    FallbackWarning) for a call the fastenc path cannot serve."""
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    method = getattr(type(self).__mro__[1], f"get_{kind}_features")
    bound = inspect.signature(method).bind(self, *args, **kwargs)
    a = dict(bound.arguments)
    a.pop("self", None)
    a.update(a.pop("kwargs", {}) or {})
    arch = type(self)._fastenc_kind[0]
    allowed = {"text": {"input_ids", "attention_mask"}, "image": {"pixel_values", "interpolate_pos_encoding"}}[kind]
    reasons = [r for r in _reasons(self, a, arch)]
    reasons += [f"{k} is not supported in get_{kind}_features" for k, v in a.items()
                if k not in allowed | {"return_dict"} and v is not None and v is not False
                and not any(k in r for r in reasons)]
    if reasons:
        _warn(self, reasons)
        return method(self, *args, **kwargs)
    fe = self.__dict__["_fastenc"]
    if fe.training != self.training:
        fe.train(self.training)
    with _weights(self, fe):
        if kind == "text":
            f = fe.get_text_features(a.get("input_ids"), a.get("attention_mask"))
        else:
            f = fe.get_image_features(a.get("pixel_values"), bool(a.get("interpolate_pos_encoding")))
    out = BaseModelOutputWithPooling(last_hidden_state=f.last_hidden_state, pooler_output=f.pooler_output)
    return_dict = a.get("return_dict")
    if return_dict is None:
        return_dict = getattr(self.config, "return_dict", True)
    return out if return_dict else out.to_tuple()


def _wrap(out_cls, task: str, logits):
    """A head's logits as transformers' output (question answering: the (start, end) pair; a dict: the fields)."""
    if isinstance(logits, dict):
        return out_cls(**logits)
    if task == "question_answering":
        return out_cls(start_logits=logits[0], end_logits=logits[1])
    return out_cls(logits=logits)


def _live(self, entries) -> dict:
    """fastenc parameter name -> its value computed from transformers' parameters (differentiable)."""
    params = dict(self.named_parameters(remove_duplicate=False))  # (tied weights under each of their names)
    out = {}
    for fe_name, hs, kind in entries:
        ts = [params[h] for h in hs]
        if kind == "copy":
            out[fe_name] = ts[0]
        elif kind in ("qkv", "cat"):
            out[fe_name] = torch.cat(ts, 0)
        elif kind == "scale":
            out[fe_name] = convert.scaled(hs, ts[0], ts[1])
        else:  # "patch"
            out[fe_name] = ts[0].reshape(ts[0].shape[0], -1)
    return out


@contextlib.contextmanager
def _weights(self, fe):
    """Run fe on transformers' current parameters: swapped in for the call when autograd records it, else fe's
    own tensors (shared with transformers') with every derived one (fused QKV) refreshed if its sources changed."""
    entries = self.__dict__["_fastenc_entries"]
    if torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters()):
        live = _live(self, entries)
        owners = {}
        for name, value in live.items():
            mod_name, _, attr = name.rpartition(".")
            mod = fe.get_submodule(mod_name) if mod_name else fe
            owners[name] = (mod, attr, mod._parameters[attr])
            mod._parameters[attr] = value
        try:
            yield
        finally:
            for mod, attr, old in owners.values():
                mod._parameters[attr] = old
        return
    _refresh(self, fe, entries)
    yield


def _refresh(self, fe, entries) -> None:
    """Copy transformers' parameters into fe's tensors that are not the same memory, when they changed since the
    last copy (their version counters, which load_state_dict and most in-place writes bump, and the count of optimizer
    steps: torch's fused optimizers bump no version counter, fastenc/layers/steps.py)."""
    params = dict(self.named_parameters(remove_duplicate=False))  # (tied weights under each of their names)
    seen = self.__dict__.setdefault("_fastenc_versions", {})
    mine = dict(fe.named_parameters(remove_duplicate=False))  # (tied weights under each of their names)
    stale = []
    steps = optimizer_steps()
    for fe_name, hs, kind in entries:
        key = (steps,) + tuple((params[h]._version, params[h].data_ptr()) for h in hs)
        if seen.get(fe_name) != key:
            p = mine[fe_name]
            if kind != "copy" or p.data_ptr() != params[hs[0]].data_ptr():
                stale.append((fe_name, hs, kind))
            seen[fe_name] = key
    if stale:
        with torch.inference_mode(False), torch.no_grad():
            for fe_name, value in _live(self, stale).items():
                mine[fe_name].copy_(value)


def _apply(self, fn, *args, **kwargs):
    # Move / cast the transformers modules, then rebuild the fastenc model on the result (shared tensors).
    res = type(self).__mro__[1]._apply(self, fn, *args, **kwargs)
    old = self.__dict__.get("_fastenc")
    if old is not None:
        self.__dict__["_fastenc"] = _derived(from_hf(self, copy=self.__dict__.get("_fastenc_copy", False)))
        self.__dict__["_fastenc_versions"] = {}
        quant_model.carry(old, self.__dict__["_fastenc"])  # (int8 layers stay int8: the call then checks the device)
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
    fe = _derived(from_hf(hf_model, copy=copy))
    sig = inspect.signature(base.forward)

    def forward(self, *args, **kwargs):
        return _fast_forward(self, *args, **kwargs)

    forward.__signature__ = sig
    forward.__doc__ = base.forward.__doc__
    methods = {"forward": forward}
    if architecture.get(SUPPORTED[name][0]).modality == "text+vision" and SUPPORTED[name][1] == "base":
        for kind in ("text", "image"):  # (the towers' embeddings: what sentence-transformers calls)
            methods[f"get_{kind}_features"] = _features_method(base, kind)
    cls = type(base.__name__, (base,), {
        **methods, "_apply": _apply, "_fastenc_kind": SUPPORTED[name], "_fastenc_signature": sig,
        "__module__": base.__module__, "__qualname__": base.__qualname__,
    })
    obj = cls.__new__(cls)
    obj.__dict__.update(hf_model.__dict__)
    for k in ("_modules", "_parameters", "_buffers", "_non_persistent_buffers_set"):
        if k in obj.__dict__:
            obj.__dict__[k] = type(obj.__dict__[k])(obj.__dict__[k])
    obj.__dict__["_fastenc"] = fe
    obj.__dict__["_fastenc_copy"] = copy
    arch, task = SUPPORTED[name]
    obj.__dict__["_fastenc_entries"] = architecture.get(arch).entries(fe.config, task)
    obj.__dict__["_fastenc_versions"] = {}
    return obj


def _features_method(base, kind: str):
    """get_<kind>_features for the accelerated class: base's signature and doc, run by _fast_features."""
    original = getattr(base, f"get_{kind}_features")

    def method(self, *args, **kwargs):
        return _fast_features(self, kind, *args, **kwargs)

    method.__signature__ = inspect.signature(original)
    method.__doc__ = original.__doc__
    method.__name__ = original.__name__
    return method


def _derived(fe):
    """Mark fe as running on weights computed per call from transformers' parameters (`params_from_hf`): a model
    that keeps an inference form of its weights (DINOv2's folded layer scale) keeps it in training too, since the
    per-call weights are computed in that form. Returns fe."""
    fe.__dict__["params_from_hf"] = True
    return fe


def _column0_real(mask) -> bool:
    """Whether column 0 is a real token in every row (no left padding): it is then each row's first token."""
    return mask is None or (mask.shape[1] > 0 and bool(mask[:, 0].bool().all()))
