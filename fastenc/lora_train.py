"""Trainable unmerged LoRA on fastenc models, with PEFT's names, initialization and files (Hu et al. 2021, "LoRA";
PEFT's LoraConfig / adapter_config.json + adapter_model.safetensors).

    model.add_lora(r=8, lora_alpha=16, target_modules=["query", "value"], lora_dropout=0.1)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)   # A, B (+ saved heads)
    ...train...
    model.save_lora("adapter_dir")          # PeftModel.from_pretrained(hf_model, "adapter_dir") loads it

Targets are named as in transformers (BERT query/key/value/dense, ModernBERT Wqkv/Wo/Wi, ViT q_proj/...), matched
as PEFT matches them (a list entry matches a module whose name is it or ends in "." + it; a str is a regex that must
match the whole name), and land on fastenc's modules through the weight maps: query/key/value on their third of the
fused Wqkv rows. A is (r, in) Kaiming-uniform with a = sqrt(5) (nn.Linear's own init: U(-1/sqrt(in), 1/sqrt(in))),
B is (out, r) zeros, scale = lora_alpha / r (rslora: / sqrt(r)); y = x W^T + b + scale * B A dropout(x).
The adapted layer runs ops.lora_linear (forward and backward fused, unmerged) with the parts of a fused Wqkv
combined into one A = [A_q; A_v] and one block-placed B (scale folded in), except while lora_dropout > 0 in train
mode: each part's adapter then reads its own dropout(x) and the base GEMM reads x, as in PEFT (the base product,
then the adapters' accumulated into it by addmm).
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from fastenc import ops
from fastenc.layers.dropout import dropout
from fastenc.layers.linear import Linear
from fastenc.layers.steps import optimizer_steps
from fastenc.lora_files import Full, Piece, check_finite, merged_values, plan, state_of, target_table, write_merged

_PART_KEYS = ("q", "k", "v")  # the thirds of a fused Wqkv; "w" = the whole output
# PEFT's task types whose head is saved (modules_to_save) by default, by fastenc task, and the module names each
# adds to modules_to_save (PeftModelForSequenceClassification / ...TokenClassification / ...QuestionAnswering).
TASK_TYPES = {"sequence_classification": "SEQ_CLS", "token_classification": "TOKEN_CLS",
              "question_answering": "QUESTION_ANS"}
HEAD_MODULES = {"SEQ_CLS": ("classifier", "score"), "TOKEN_CLS": ("classifier", "score"),
                "QUESTION_ANS": ("qa_outputs",)}


class LoraAdapter(nn.Module):
    """One adapter on one Linear.

    kind "lora": lora_A[key] (r, in) and lora_B[key] (rows, r) per part of the output rows (key q/k/v: a third of a
    fused Wqkv; w: all rows), with `parts` [(key, rows slice, scale, PEFT module name)] and `dropout` (p).
    kind "full": weight (out, in) and bias (out,) or None, a trained copy of the layer (PEFT's modules_to_save).
    """

    def __init__(self, kind: str, dropout: float = 0.0):
        super().__init__()
        self.kind, self.dropout = kind, float(dropout)
        self.parts: list[tuple[str, slice, float, str]] = []
        self.names: dict[str, str] = {}
        if kind == "lora":
            self.lora_A, self.lora_B = nn.ParameterDict(), nn.ParameterDict()
        self._cache: tuple | None = None

    def add_part(self, key: str, rows: slice, scale: float, peft_name: str, a: torch.Tensor, b: torch.Tensor,
                 trainable: bool) -> None:
        self.lora_A[key] = nn.Parameter(a, requires_grad=trainable)
        self.lora_B[key] = nn.Parameter(b, requires_grad=trainable)
        self.parts.append((key, rows, float(scale), peft_name))
        self.parts.sort(key=lambda p: p[1].start)

    def combined(self, out_features: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(A (R, in), B (out, R)) in `dtype` with every part's scale folded into B; R = the parts' ranks summed.
        B = sum_j pad(s_j B_j) into rows_j and columns col_j..col_j + r_j (differentiable; cached while no
        part can take a gradient)."""
        params = [t for key, *_ in self.parts for t in (self.lora_A[key], self.lora_B[key])]
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in params)
        tag = (dtype, params[0].device, torch.is_inference_mode_enabled(), optimizer_steps(),
               tuple((id(t), t._version) for t in params))  # (fused optimizers bump no version: layers/steps.py)
        if not grad and self._cache is not None and self._cache[0] == tag:
            return self._cache[1]
        a_list = [self.lora_A[key] for key, *_ in self.parts]
        a = a_list[0] if len(a_list) == 1 else torch.cat(a_list, 0)
        total, col, b = a.shape[0], 0, None
        for key, rows, scale, _ in self.parts:
            bj = self.lora_B[key] * scale
            r = bj.shape[1]
            bj = F.pad(bj, (col, total - col - r, rows.start, out_features - rows.stop))
            b = bj if b is None else b + bj
            col += r
        out = (a.to(dtype).contiguous(), b.to(dtype).contiguous())
        self._cache = None if grad else (tag, out)
        return out


class LoraLinear(Linear):
    """A fastenc Linear carrying unmerged adapters (`self.lora`, one LoraAdapter per adapter name): the active one
    runs y = ops.lora_linear(x, W, b, A, B, 1) (scale folded into B), or F.linear with a modules_to_save copy's
    own weight and bias; no active adapter: the plain Linear. Modules become this class only while they carry
    adapters (their class is switched back when the last adapter is removed)."""

    def _active(self) -> LoraAdapter | None:
        state = self.__dict__.get("_lora_state")
        name = state.current() if state is not None else None
        lora = self._modules.get("lora")
        return None if name is None or lora is None or name not in lora else lora[name]

    def output_bias(self) -> torch.Tensor | None:
        ad = self._active()
        return ad.bias if ad is not None and ad.kind == "full" else self.bias

    def accumulate_(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return out.add_(self.forward(x, with_bias=False))

    def forward(self, x: torch.Tensor, with_bias: bool = True) -> torch.Tensor:
        ad = self._active()
        if ad is None:
            return super().forward(x, with_bias)
        if ad.kind == "full":
            bias = None if not with_bias or ad.bias is None else ad.bias.to(x.dtype)
            return F.linear(x, ad.weight.to(x.dtype), bias)
        a, b = ad.combined(self.out_features, x.dtype)
        bias = self.bias if with_bias else None
        if self.training and ad.dropout > 0:  # PEFT: base(x) + B A dropout(x) * scale
            out = F.linear(x, self.weight, bias)
            # One dropout mask per part, in row order (PEFT's query and value adapters are separate layers with
            # their own dropout), each part's rows of A reading its own dropped x.
            ranks = [ad.lora_A[key].shape[0] for key, *_ in ad.parts]
            hs = [F.linear(dropout(x, ad.dropout), aj) for aj in a.split(ranks)]
            h = hs[0] if len(hs) == 1 else torch.cat(hs, -1)
            if out.dim() != 2:
                return out + F.linear(h, b)
            return out.addmm_(h, b.t())  # accumulated into the base product: no second (tokens, out) tensor
        return ops.lora_linear(x, self.weight, bias, a, b, 1.0)


def attach(model, module_name: str, adapter_name: str, adapter: LoraAdapter, state) -> None:
    """Put `adapter` on the Linear `module_name` (switching it to LoraLinear)."""
    module = model.get_submodule(module_name)
    if type(module) is Linear:
        module.__class__ = LoraLinear
    if "lora" not in module._modules:
        module.add_module("lora", nn.ModuleDict())
    module.lora[adapter_name] = adapter
    module.__dict__["_lora_state"] = state


def detach(model, module_name: str, adapter_name: str) -> None:
    """Remove one adapter from a module; one left without adapters becomes a plain Linear again."""
    module = model.get_submodule(module_name)
    lora = module._modules.get("lora")
    if lora is not None and adapter_name in lora:
        del lora[adapter_name]
    if lora is None or len(lora) == 0:
        module._modules.pop("lora", None)
        module.__dict__.pop("_lora_state", None)
        if type(module) is LoraLinear:
            module.__class__ = Linear


def adapters_from_plan(model, pieces, fulls, trainable: bool, dropout: float = 0.0) -> dict[str, LoraAdapter]:
    """{fastenc module: LoraAdapter} holding copies of a planned adapter's tensors in each layer's dtype/device."""
    out: dict[str, LoraAdapter] = {}
    for f in fulls:
        w = model.get_submodule(f.module).weight
        ad = LoraAdapter("full")
        ad.weight = nn.Parameter(f.weight.detach().to(device=w.device, dtype=w.dtype).clone(), requires_grad=trainable)
        ad.bias = (None if f.bias is None else
                   nn.Parameter(f.bias.detach().to(device=w.device, dtype=w.dtype).clone(), requires_grad=trainable))
        ad.names["full"] = f.peft_name
        out[f.module] = ad
    for p in pieces:
        module = model.get_submodule(p.module)
        w = module.weight
        ad = out.setdefault(p.module, LoraAdapter("lora", dropout))
        size = p.rows.stop - p.rows.start
        third = p.rows.start // size if size < module.out_features else None
        key = "w" if third is None else _PART_KEYS[third]
        a = p.a.detach().to(device=w.device, dtype=w.dtype).clone()
        b = p.b.detach().to(device=w.device, dtype=w.dtype).clone()
        ad.add_part(key, p.rows, p.scale, p.peft_name, a, b, trainable)
    return out


# ---------------------------------------------------------------- add_lora

def _check_args(r, lora_alpha, target_modules, lora_dropout, adapter_name, modules_to_save, use_rslora) -> None:
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise ValueError(f"add_lora: r must be an int >= 1, got {r!r}")
    if (isinstance(lora_alpha, bool) or not isinstance(lora_alpha, (int, float)) or not math.isfinite(lora_alpha)
            or lora_alpha <= 0):
        raise ValueError(f"add_lora: lora_alpha must be a number > 0, got {lora_alpha!r}")
    if isinstance(lora_dropout, bool) or not isinstance(lora_dropout, (int, float)) or not 0 <= lora_dropout < 1:
        raise ValueError(f"add_lora: lora_dropout must be a number in [0, 1), got {lora_dropout!r}")
    if not isinstance(adapter_name, str) or not adapter_name or "." in adapter_name:
        raise ValueError(f"add_lora: adapter_name must be a non-empty str without '.', got {adapter_name!r}")
    if not isinstance(use_rslora, bool):
        raise TypeError(f"add_lora: use_rslora must be a bool, got {type(use_rslora).__name__}")
    ok = isinstance(target_modules, str) or (isinstance(target_modules, (list, tuple)) and target_modules and
                                             all(isinstance(t, str) and t for t in target_modules))
    if not ok:
        raise ValueError(f"add_lora: target_modules must be a non-empty list of module names or a regex str, got "
                         f"{target_modules!r}")
    if modules_to_save is not None and not (isinstance(modules_to_save, (list, tuple)) and
                                            all(isinstance(t, str) and t for t in modules_to_save)):
        raise ValueError(f"add_lora: modules_to_save must be None or a list of module names, got {modules_to_save!r}")


def _hf_linears(model) -> list[str]:
    """Every Linear-backed HF module name of `model` as transformers names it (with the head model's prefix)."""
    from fastenc.models import architecture

    table = target_table(model)
    hf_names = {h[:-len(".weight")] for _, hs, _ in architecture.of_model(model).entries(model.config, model.task)
                for h in hs if h.endswith(".weight")}
    return sorted(n for n in hf_names if n in table and table[n][2] != "patch"
                  and isinstance(model.get_submodule(table[n][0]), Linear))


def _matches(name: str, target) -> bool:
    if isinstance(target, str):
        return re.fullmatch(target, name) is not None
    return any(name == t or name.endswith("." + t) for t in target)


def _saved(name: str, saves) -> bool:
    """Whether PEFT's modules_to_save `saves` take the linear `name`: a plain suffix of its name ("classifier" takes
    DeiT's cls_classifier and distillation_classifier) or a module holding it."""
    return any(name.endswith(t) or f".{t}." in f".{name}." for t in saves)


def default_targets(model) -> tuple[str, ...]:
    """PEFT's usual target modules for `model`: its architecture's `lora_targets` (fastenc.models.architecture); for
    an architecture that declares none, the query and value projections when its weight map names them so."""
    from fastenc.models import architecture

    declared = architecture.of_model(model).lora_targets
    if declared:
        return tuple(declared)
    names = {h.rpartition(".")[2] for h in target_table(model)}
    found = tuple(n for n in ("query", "value") if n in names)
    if not found:
        raise ValueError(f"add_lora: {type(model).__name__}'s architecture declares no lora_targets; name "
                         f"target_modules")
    return found


def add_lora(model, r: int = 8, lora_alpha: float = 16, target_modules=None, lora_dropout: float = 0.0,
             adapter_name: str = "default", modules_to_save=None, use_rslora: bool = False) -> str:
    """See LoraMixin.add_lora. Validates everything, builds every tensor, then attaches (nothing half-applied)."""
    if target_modules is None:
        target_modules = default_targets(model)
    _check_args(r, lora_alpha, target_modules, lora_dropout, adapter_name, modules_to_save, use_rslora)
    st = state_of(model)
    if adapter_name in st.unmerged or adapter_name in st.merged:
        raise ValueError(f"add_lora: adapter_name {adapter_name!r} is already used; loaded adapters: "
                         f"{sorted(st.unmerged) + sorted(st.merged)}")
    linears = _hf_linears(model)
    task_type = TASK_TYPES.get(model.task)
    saves = list(modules_to_save) if modules_to_save is not None else []
    if task_type is not None:  # PEFT's SEQ_CLS / TOKEN_CLS / QUESTION_ANS add the head to modules_to_save
        saves += [h for h in HEAD_MODULES[task_type] if h not in saves]
    # (PEFT matches modules_to_save by plain suffix: "classifier" also takes DistilBERT's pre_classifier; and it
    # saves a whole module: the Linears inside RoBERTa's / ELECTRA's two-layer classifier)
    save_hits = [n for n in linears if _saved(n, saves)]
    targets = [n for n in linears if _matches(n, target_modules) and n not in save_hits]
    unknown = ([] if isinstance(target_modules, str) else
               [t for t in target_modules if not any(_matches(n, [t]) for n in linears)])
    if unknown or not targets:
        raise ValueError(f"add_lora: target_modules {unknown or target_modules!r} match no linear layer of "
                         f"{type(model).__name__} ({model.config.model_type}); its linear layers are named like "
                         f"{linears[:2] + linears[-2:]}")
    missing_saves = [s for s in (modules_to_save or []) if not any(_saved(n, [s]) for n in linears)]
    if missing_saves:
        raise ValueError(f"add_lora: modules_to_save {missing_saves} match no linear layer of "
                         f"{type(model).__name__}; its linear layers are named like {linears[-3:]}")
    state = {}
    for name in targets:
        module = model.get_submodule(_fe_module(model, name))
        rows = module.out_features // 3 if _third(model, name) is not None else module.out_features
        a = torch.empty(r, module.in_features, dtype=torch.float32)
        nn.init.kaiming_uniform_(a, a=math.sqrt(5))
        state[f"{name}.lora_A.weight"] = a
        state[f"{name}.lora_B.weight"] = torch.zeros(rows, r)
    for name in save_hits:
        module = model.get_submodule(_fe_module(model, name))
        state[f"{name}.weight"] = module.weight.detach()
        if module.bias is not None:
            state[f"{name}.bias"] = module.bias.detach()
    config = make_config(r, lora_alpha, target_modules, lora_dropout, saves if task_type or modules_to_save else None,
                         use_rslora, task_type)
    pieces, fulls = plan(model, config, state)
    ads = adapters_from_plan(model, pieces, fulls, trainable=True, dropout=lora_dropout)
    for p in model.parameters():
        p.requires_grad_(False)
    for mod_name, ad in ads.items():
        attach(model, mod_name, adapter_name, ad, st)
    st.unmerged[adapter_name] = list(ads)
    st.configs[adapter_name] = config
    st.trainable.add(adapter_name)
    st.default = adapter_name
    set_trainable(model, st)
    return adapter_name


def _fe_module(model, hf_name: str) -> str:
    return target_table(model)[hf_name][0]


def _third(model, hf_name: str):
    return target_table(model)[hf_name][1]


def make_config(r, lora_alpha, target_modules, lora_dropout, modules_to_save, use_rslora, task_type) -> dict:
    """A PEFT LoraConfig dict (the fields PEFT reads; it fills the rest with its defaults)."""
    return {"peft_type": "LORA", "task_type": task_type, "r": r, "lora_alpha": lora_alpha,
            "target_modules": target_modules if isinstance(target_modules, str) else sorted(set(target_modules)),
            "lora_dropout": float(lora_dropout), "bias": "none", "use_rslora": use_rslora,
            "modules_to_save": modules_to_save, "fan_in_fan_out": False, "init_lora_weights": True,
            "rank_pattern": {}, "alpha_pattern": {}, "inference_mode": True, "base_model_name_or_path": None}


def set_trainable(model, st) -> None:
    """Only the active adapter trains (if it is trainable); every other adapter's tensors stay frozen."""
    for name, modules in st.unmerged.items():
        on = name == st.default and name in st.trainable
        for mod_name in modules:
            for p in model.get_submodule(mod_name).lora[name].parameters():
                p.requires_grad_(on)


# ---------------------------------------------------------------- merging a trained adapter

def merge_trained(model, names: list[str] | None, unload: bool, safe_merge: bool, op: str) -> list[str]:
    """See LoraMixin.merge_lora / merge_and_unload: every merged value is computed (and, with safe_merge, checked
    finite) before a weight is written or an adapter removed. Returns the merged adapter names."""

    if not isinstance(safe_merge, bool):
        raise TypeError(f"{op}: safe_merge must be a bool, got {type(safe_merge).__name__}")
    st = state_of(model)
    if names is None:
        if st.default is None and (st.unmerged or not unload):
            raise ValueError(f"{op}: no active adapter to merge (unmerged adapters: {sorted(st.unmerged)}); name one"
                             f" or call set_adapter first")
        names = [] if st.default is None else [st.default]
    bad = [n for n in names if n not in st.unmerged]
    if bad or len(set(names)) != len(names):
        raise ValueError(f"{op}: adapter(s) {bad or names} are not distinct unmerged adapters of "
                         f"{type(model).__name__}; unmerged: {sorted(st.unmerged)}, merged: {st.merged}")
    if unload and not names and not st.merged:
        raise ValueError(f"{op}: {type(model).__name__} has no LoRA adapter (add_lora or load_lora first)")
    new: dict[str, torch.Tensor] = {}
    for name in names:
        pieces, fulls = [], []
        for mod_name in st.unmerged[name]:
            ad = model.get_submodule(mod_name).lora[name]
            if ad.kind == "full":
                fulls.append(Full(ad.names["full"], mod_name, ad.weight.detach(),
                                   None if ad.bias is None else ad.bias.detach()))
                continue
            pieces += [Piece(peft_name, mod_name, rows, ad.lora_A[key].detach(), ad.lora_B[key].detach(), scale)
                       for key, rows, scale, peft_name in ad.parts]
        merged_values(model, pieces, fulls, new)
    if safe_merge:
        check_finite(", ".join(names), new, op)
    write_merged(model, new, st, keep_originals=not unload)
    if unload:
        model.remove_lora()
        st.originals.clear()
        st.merged.clear()
    else:
        for name in names:
            model.remove_lora(name)
            st.merged.append(name)
    return names


# ---------------------------------------------------------------- save_lora

def _jsonable(v):
    """A PEFT config value as JSON (sets as sorted lists, enums by value)."""
    if isinstance(v, (set, frozenset)):
        return sorted(v)
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    return getattr(v, "value", str(v))


def save_lora(model, folder, adapter_name: str | None = None) -> Path:
    """See LoraMixin.save_lora."""

    st = state_of(model)
    if not st.unmerged:
        raise ValueError(f"save_lora: {type(model).__name__} has no unmerged adapter to save (add_lora(...) or "
                         f"load_lora(folder, merge=False) first)")
    if adapter_name is None:
        adapter_name = st.default if st.default is not None else next(iter(st.unmerged))
    if adapter_name not in st.unmerged:
        raise ValueError(f"save_lora: adapter_name {adapter_name!r} is not an unmerged adapter; loaded: "
                         f"{sorted(st.unmerged)}")
    tensors: dict[str, torch.Tensor] = {}
    for mod_name in st.unmerged[adapter_name]:
        ad = model.get_submodule(mod_name).lora[adapter_name]
        if ad.kind == "full":
            tensors[f"base_model.model.{ad.names['full']}.weight"] = ad.weight
            if ad.bias is not None:
                tensors[f"base_model.model.{ad.names['full']}.bias"] = ad.bias
            continue
        for key, _, _, peft_name in ad.parts:
            tensors[f"base_model.model.{peft_name}.lora_A.weight"] = ad.lora_A[key]
            tensors[f"base_model.model.{peft_name}.lora_B.weight"] = ad.lora_B[key]
    from safetensors.torch import save_file

    from fastenc.models.saving import write_files

    config = {k: _jsonable(v) for k, v in st.configs[adapter_name].items()}
    cpu = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    text = json.dumps(config, indent=2, sort_keys=True) + "\n"
    return write_files("save_lora", folder, {
        "adapter_model.safetensors": lambda path: save_file(cpu, path, metadata={"format": "pt"}),
        "adapter_config.json": lambda path: Path(path).write_text(text)})
