"""PEFT LoRA adapters on fastenc models (Hu et al. 2021, "LoRA"; PEFT's adapter_config.json +
adapter_model.safetensors format): merged at zero inference cost, or kept unmerged as named adapters chosen per call.

    model = fastenc.from_hf(hf_model)                     # BertModel, ModernBertModel, ViTModel (+ heads)
    model.load_lora("adapter_dir")                        # merge: W <- W + scale * B @ A (fastenc.ops.merge_lora)
    model.unmerge_lora()                                  # the original weights back, bit for bit
    model.load_lora(peft_model, merge=False, adapter_name="a")   # unmerged, routed through ops.lora_linear
    model(ids, mask, adapter="a")                         # per call; or model.set_adapter("a") / use_adapter("a")

PEFT module names map onto fastenc's modules through the weight maps of the architecture table
(fastenc.models.architecture), so a query/key/value adapter lands on its third of the fused Wqkv rows. Everything
is validated before the model is touched: a bad adapter raises and leaves the model exactly as it was. The models
inherit `LoraMixin`.
Adapter files and merging: fastenc.lora_files. Trainable adapters (add_lora, save_lora, load_lora(..., merge=False,
is_trainable=True)): fastenc.lora_train. A trained adapter folds into the weights with merge_lora() (undone by
unmerge_lora) or merge_and_unload() (PEFT's: for good). This module is the models' face: `LoraMixin`.
"""
from __future__ import annotations

import contextlib
from typing import Any

import torch

from fastenc.lora_files import (KEEP, SCALE_NAME, Full, Piece, State, check_config, check_finite, merged_values,
                                plan, read_adapter, state_of, target_table, write_merged)
from fastenc.quant.model import refuse
from fastenc.lora_train import (LoraAdapter, LoraLinear, adapters_from_plan, add_lora, attach, default_targets, detach,
                                merge_trained, save_lora, set_trainable)

__all__ = ["LoraMixin", "LoraAdapter", "LoraLinear", "add_lora", "save_lora", "read_adapter", "check_config",
           "target_table", "default_targets", "plan", "merged_values", "write_merged", "Piece", "Full", "State",
           "SCALE_NAME"]


class LoraMixin:
    """load_lora / unmerge_lora / set_adapter / use_adapter / remove_lora, and `model(..., adapter=name)`."""

    def load_lora(self, source, merge: bool = True, adapter_name: str | None = None,
                  peft_adapter: str | None = None, safe_merge: bool = False, is_trainable: bool = False) -> str:
        """Load a PEFT LoRA adapter (folder with adapter_config.json + adapter_model.safetensors, or a PeftModel).

        merge=True: W <- round(W + scale * B @ A) in place, fp32 accumulation (ops.merge_lora); the original
        weights are kept so `unmerge_lora()` restores them exactly. merge=False: keep it as the named unmerged
        adapter `adapter_name` (default: the PeftModel's adapter name, or the folder's name), applied when active
        (the first one loaded is the default; see set_adapter). peft_adapter: which adapter of a PeftModel to
        read (default: its active one). safe_merge=True (PEFT's option): check that every weight the adapter
        produces (merged, or the unmerged adapter's tensors) is finite first, and refuse the adapter otherwise.
        is_trainable=True (merge=False only; PEFT's option): the adapter becomes the active one and its tensors
        require grad, every base parameter is frozen, so training continues from it (save_lora writes it back).
        Returns the name. Raises (and changes nothing) on a bad adapter: see `plan`.
        """
        refuse(self, "load_lora")
        if not isinstance(merge, bool):
            raise TypeError(f"load_lora: merge must be a bool, got {type(merge).__name__}")
        if not isinstance(safe_merge, bool):
            raise TypeError(f"load_lora: safe_merge must be a bool, got {type(safe_merge).__name__}")
        if not isinstance(is_trainable, bool):
            raise TypeError(f"load_lora: is_trainable must be a bool, got {type(is_trainable).__name__}")
        if is_trainable and merge:
            raise ValueError("load_lora: is_trainable=True needs merge=False (a merged adapter cannot be trained)")
        if adapter_name is not None and (not isinstance(adapter_name, str) or not adapter_name or "." in adapter_name):
            raise ValueError(f"load_lora: adapter_name must be a non-empty str without '.', got {adapter_name!r}")
        config, state, name = read_adapter(source, peft_adapter)
        name = adapter_name or name.replace(".", "_")
        st = state_of(self)
        if name in st.unmerged or name in st.merged:
            raise ValueError(f"load_lora: an adapter named {name!r} is already loaded "
                             f"({'merged' if name in st.merged else 'unmerged'}); pick another adapter_name")
        pieces, fulls = plan(self, config, state)
        if merge:
            new = merged_values(self, pieces, fulls)  # all computed before anything is written
            if safe_merge:
                check_finite(name, new)
            write_merged(self, new, st, keep_originals=True)
            st.merged.append(name)
            return name
        ads = adapters_from_plan(self, pieces, fulls, trainable=is_trainable,
                                 dropout=float(config.get("lora_dropout") or 0.0))
        if safe_merge:
            check_finite(name, {f"{m}.{k}": t for m, ad in ads.items() for k, t in ad.named_parameters()})
        if is_trainable:  # as PEFT's from_pretrained(is_trainable=True): the base model is frozen
            for p in self.parameters():
                p.requires_grad_(False)
        for mod_name, ad in ads.items():
            attach(self, mod_name, name, ad, st)
        st.unmerged[name] = list(ads)
        st.configs[name] = config
        if is_trainable:
            st.trainable.add(name)
            st.default = name
        elif st.default is None:
            st.default = name
        set_trainable(self, st)
        return name

    def unmerge_lora(self) -> None:
        """Restore every weight changed by merged adapters to its exact original value (unmerged adapters stay)."""
        st = state_of(self)
        with torch.no_grad():
            for pname, orig in st.originals.items():
                param = self.get_parameter(pname)
                param.copy_(orig.to(device=param.device, dtype=param.dtype))
        st.originals.clear()
        st.merged.clear()

    def remove_lora(self, adapter_name: str | None = None) -> None:
        """Drop one unmerged adapter (or all with None); modules left without adapters become plain Linear."""
        st = state_of(self)
        names = list(st.unmerged) if adapter_name is None else [adapter_name]
        for n in names:
            if n not in st.unmerged:
                raise ValueError(f"remove_lora: no unmerged adapter {n!r}; loaded: {sorted(st.unmerged)}")
            for mod_name in st.unmerged.pop(n):
                detach(self, mod_name, n)
            st.trainable.discard(n)
            st.configs.pop(n, None)
            if st.default == n:
                st.default = None

    def merge_lora(self, adapter_name: str | None = None, safe_merge: bool = False) -> str:
        """Fold an unmerged adapter (default: the active one, e.g. trained after add_lora) into the base weights
        as load_lora(merge=True) does: W[rows] <- W[rows] + scale * B @ A (its third of a fused Wqkv), a
        modules_to_save copy replaces its layer. The adapter is removed and counted as merged: unmerge_lora()
        restores the weights exactly, and training is refused while it is merged. Returns its name."""
        names = None if adapter_name is None else [adapter_name]
        return merge_trained(self, names, False, safe_merge, "merge_lora")[0]

    def merge_and_unload(self, adapter_names=None, safe_merge: bool = False):
        """PEFT's merge_and_unload: fold the active adapter (or the unmerged `adapter_names`, in order) into the
        base weights for good and remove every adapter, leaving a plain model whose save_pretrained writes a plain
        transformers checkpoint. Earlier merges (load_lora(merge=True), merge_lora) become permanent (nothing left
        for unmerge_lora). Base parameters keep their requires_grad (add_lora froze them, as PEFT does).
        Returns the model."""
        if adapter_names is not None and not isinstance(adapter_names, (list, tuple)):
            raise TypeError(f"merge_and_unload: adapter_names must be None or a list of adapter names, got "
                            f"{adapter_names!r}")
        merge_trained(self, None if adapter_names is None else list(adapter_names), True, safe_merge,
                      "merge_and_unload")
        return self

    def _check_adapter(self, name) -> None:
        if name is not None and name not in state_of(self).unmerged:
            raise ValueError(f"adapter {name!r} is not loaded unmerged; loaded: {sorted(state_of(self).unmerged)}")

    def set_adapter(self, adapter_name: str | None) -> None:
        """The unmerged adapter used by calls that do not name one (None: no adapter). As in PEFT, the active
        adapter is the one that trains (if it was added, or loaded with is_trainable=True); the others are frozen."""
        self._check_adapter(adapter_name)
        st = state_of(self)
        st.default = adapter_name
        set_trainable(self, st)

    def add_lora(self, r: int = 8, lora_alpha: float = 16, target_modules=None,
                 lora_dropout: float = 0.0, adapter_name: str = "default", modules_to_save=None,
                 use_rslora: bool = False) -> str:
        """A new trainable LoRA adapter, as PEFT's get_peft_model(model, LoraConfig(...)) makes it.

        target_modules: transformers module names (BERT query/key/value/dense, ModernBERT Wqkv/Wo/Wi, ViT
        q_proj/k_proj/v_proj/o_proj/fc1/fc2; a list entry matches a name ending in it, a str is a full-match regex);
        None: the architecture's usual targets (its `lora_targets` in fastenc.models.architecture).
        A (r, in): Kaiming-uniform (a=sqrt(5)); B (out, r): zeros; scale lora_alpha / r (use_rslora: / sqrt(r)).
        lora_dropout: on the adapter's input, train mode only. modules_to_save: Linear layers trained as full
        copies (None: the classifier for sequence/token classification models, qa_outputs for question
        answering, as PEFT's SEQ_CLS / TOKEN_CLS / QUESTION_ANS).
        Afterwards only this adapter's tensors require grad (every base parameter is frozen) and it is active.
        Returns the adapter name. Raises before any change on bad input (unknown target, r < 1, lora_alpha <= 0,
        a used adapter_name).
        """
        refuse(self, "add_lora")
        return add_lora(self, r, lora_alpha, target_modules, lora_dropout, adapter_name, modules_to_save, use_rslora)

    def save_lora(self, folder, adapter_name: str | None = None):
        """Write adapter_config.json + adapter_model.safetensors (PEFT's names: base_model.model.<transformers
        module>.lora_A.weight, ...) for an unmerged adapter (default: the active one), which
        PeftModel.from_pretrained(hf_model, folder) and load_lora(folder) read. Returns the folder (a Path)."""
        return save_lora(self, folder, adapter_name)

    @contextlib.contextmanager
    def use_adapter(self, adapter_name: str | None):
        """`with model.use_adapter("a"): model.encode(texts)` — this adapter (None: none) inside the block."""
        self._check_adapter(adapter_name)
        st = state_of(self)
        token = st.active.set(adapter_name)
        try:
            yield self
        finally:
            st.active.reset(token)

    @property
    def lora_adapters(self) -> dict[str, Any]:
        st = state_of(self)
        return {"merged": list(st.merged), "unmerged": sorted(st.unmerged), "active": st.current()}

    def __call__(self, *args, adapter=KEEP, **kwargs):
        st = self.__dict__.get("_lora_state")
        if st is not None and st.merged and self.training and torch.is_grad_enabled():
            raise RuntimeError(f"{type(self).__name__}: adapter(s) {st.merged} are merged into the weights, so "
                               f"training would not reach them; call unmerge_lora() and load with merge=False (and "
                               f"is_trainable=True), or call eval() / torch.no_grad() for inference")
        if adapter is KEEP:
            return super().__call__(*args, **kwargs)
        with self.use_adapter(adapter):
            return super().__call__(*args, **kwargs)
