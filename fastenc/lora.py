"""PEFT LoRA adapters on fastenc models (Hu et al. 2021, "LoRA"; PEFT's adapter_config.json +
adapter_model.safetensors format): merged at zero inference cost, or kept unmerged as named adapters chosen per call.

    model = fastenc.from_hf(hf_model)                     # BertModel, ModernBertModel, ViTModel (+ heads)
    model.load_lora("adapter_dir")                        # merge: W <- W + scale * B @ A (fastenc.ops.merge_lora)
    model.unmerge_lora()                                  # the original weights back, bit for bit
    model.load_lora(peft_model, merge=False, adapter_name="a")   # unmerged, routed through ops.lora_linear
    model(ids, mask, adapter="a")                         # per call; or model.set_adapter("a") / use_adapter("a")

PEFT module names map onto fastenc's modules through the explicit weight maps of each architecture (fastenc.models.architecture), so a
query/key/value adapter lands on its third of the fused Wqkv rows. Supported: r, lora_alpha, use_rslora,
rank_pattern/alpha_pattern, bias="none", modules_to_save Linear copies (e.g. a SEQ_CLS classifier head). Everything is validated before the model is
touched: a bad adapter raises and leaves the model exactly as it was. The models inherit `LoraMixin`.
Training (add_lora, save_lora, load_lora(..., merge=False, is_trainable=True)): fastenc.lora_train. A trained
adapter folds into the weights with merge_lora() (undone by unmerge_lora) or merge_and_unload() (PEFT's: for good).
"""
from __future__ import annotations

import contextlib
import contextvars
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fastenc import ops
from fastenc.layers.linear import Linear
from fastenc.lora_train import LoraLinear, adapters_from_plan, attach, detach, set_trainable

SCALE_NAME = "scale = lora_alpha / r (use_rslora: lora_alpha / sqrt(r))"
_KEEP = object()
_KEY = re.compile(r"^(?P<mod>.+)\.(?P<kind>lora_A|lora_B)(?:\.(?P<adapter>[^.]+))?\.weight$")
# PEFT options fastenc cannot honour at inference; value -> reason (checked only when set to a non-default value).
_UNSUPPORTED = {
    "use_dora": "DoRA (use_dora=True) is not supported",
    "fan_in_fan_out": "fan_in_fan_out=True does not apply to these models' nn.Linear layers (weights are (out, in))",
    "lora_bias": "lora_bias=True (a bias on lora_B) is not supported",
    "layer_replication": "layer_replication is not supported",
    "target_parameters": "target_parameters (LoRA on raw parameters) is not supported",
    "use_qalora": "QA-LoRA is not supported",
}


@dataclass
class _Piece:
    """One PEFT LoRA module mapped onto fastenc: rows `rows` of the Linear `module` get scale * B @ A."""
    peft_name: str
    module: str
    rows: slice
    a: torch.Tensor
    b: torch.Tensor
    scale: float


@dataclass
class _Full:
    """A PEFT modules_to_save Linear (a fully trained copy, e.g. a classifier head): replaces weight and bias."""
    peft_name: str
    module: str
    weight: torch.Tensor
    bias: torch.Tensor | None


@dataclass
class _State:
    """Per-model LoRA bookkeeping (plain attributes: not parameters, not in state_dict)."""
    originals: dict[str, torch.Tensor] = field(default_factory=dict)   # parameter -> value before any merge
    merged: list[str] = field(default_factory=list)                      # merged adapter names, in order
    unmerged: dict[str, list[str]] = field(default_factory=dict)        # adapter -> modules it routes
    default: str | None = None                                          # set_adapter()
    trainable: set = field(default_factory=set)                          # adapters that train while active
    configs: dict[str, dict] = field(default_factory=dict)               # adapter -> its PEFT config (save_lora)
    active: contextvars.ContextVar = field(default_factory=lambda: contextvars.ContextVar("fastenc_lora",
                                                                                         default=_KEEP))

    def current(self) -> str | None:
        name = self.active.get()
        return self.default if name is _KEEP else name


# ---------------------------------------------------------------- reading an adapter

def read_adapter(source, peft_adapter: str | None = None) -> tuple[dict, dict[str, torch.Tensor], str]:
    """(config dict, {key: tensor}, adapter name) from a PEFT adapter folder or a PeftModel (its adapter
    `peft_adapter`, default its active one)."""
    if isinstance(source, (str, Path)):
        folder = Path(source)
        cfg_path = folder / "adapter_config.json"
        if not cfg_path.is_file():
            raise FileNotFoundError(f"load_lora: {folder} has no adapter_config.json (expected a PEFT adapter folder)")
        try:
            config = json.loads(cfg_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"load_lora: {cfg_path} is not valid JSON: {e}") from None
        if not isinstance(config, dict):
            raise ValueError(f"load_lora: {cfg_path} must hold a JSON object, got {type(config).__name__}")
        st_path, bin_path = folder / "adapter_model.safetensors", folder / "adapter_model.bin"
        if not st_path.is_file() and not bin_path.is_file():
            raise FileNotFoundError(f"load_lora: {folder} has no adapter_model.safetensors or adapter_model.bin")
        path = st_path if st_path.is_file() else bin_path
        try:  # a corrupt or truncated file: one error naming it
            if path is st_path:
                from safetensors.torch import load_file
                state = load_file(str(st_path))
            else:
                state = torch.load(bin_path, map_location="cpu", weights_only=True)
        except Exception as e:
            raise ValueError(f"load_lora: cannot read {path}: {type(e).__name__}: {e}") from None
        if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
            raise ValueError(f"load_lora: {path} must hold a dict of tensors, got {type(state).__name__}")
        return config, state, folder.name or "default"
    peft_config = getattr(source, "peft_config", None)
    if isinstance(peft_config, dict) and peft_config:
        from peft import get_peft_model_state_dict

        name = peft_adapter or getattr(source, "active_adapter", None) or next(iter(peft_config))
        if name not in peft_config:
            raise ValueError(f"load_lora: the PeftModel has no adapter {name!r}; it has {sorted(peft_config)}")
        cfg = peft_config[name]
        config = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(vars(cfg))
        state = get_peft_model_state_dict(source, adapter_name=name)
        return config, {k: v.detach() for k, v in state.items()}, name
    raise TypeError(f"load_lora: source must be a PEFT adapter folder (str or Path) or a PeftModel, got "
                    f"{type(source).__name__}")


def _pattern(patterns: dict | None, key: str):
    """PEFT's rank_pattern / alpha_pattern lookup: a pattern matches a module name ending in it (regex)."""
    for pat, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({pat})$", key):
            return value
    return None


def check_config(config: dict) -> None:
    peft_type = str(config.get("peft_type", "LORA")).upper().replace("PEFTTYPE.", "")
    if peft_type != "LORA":
        raise ValueError(f"load_lora: peft_type must be LORA, got {config.get('peft_type')!r}")
    for opt, why in _UNSUPPORTED.items():
        v = config.get(opt)
        if v not in (None, False, [], {}, ""):
            raise ValueError(f"load_lora: {why} (adapter_config {opt}={v!r})")
    if config.get("bias", "none") != "none":
        raise ValueError(f"load_lora: bias must be 'none' (trained biases are not supported), "
                         f"got {config.get('bias')!r}")
    r = config.get("r")
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise ValueError(f"load_lora: r must be a positive int, got {r!r}")
    alphas = [config.get("lora_alpha")] + list((config.get("alpha_pattern") or {}).values())
    for alpha in alphas:
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha <= 0:
            raise ValueError(f"load_lora: lora_alpha must be a number > 0, got {alpha!r}")
    for rr in (config.get("rank_pattern") or {}).values():
        if isinstance(rr, bool) or not isinstance(rr, int) or rr < 1:
            raise ValueError(f"load_lora: rank_pattern ranks must be positive ints, got {rr!r}")


# ---------------------------------------------------------------- mapping PEFT names onto a fastenc model

def _arch(model) -> str:
    return getattr(model.config, "model_type", "")


def target_table(model) -> dict[str, tuple[str, int | None, str]]:
    """HF module name (with and without the head prefix) -> (fastenc module, third of Wqkv or None, kind)."""
    from fastenc.models import architecture

    arch = _arch(model)
    if arch not in architecture.architectures():
        raise TypeError(f"load_lora: {type(model).__name__} is not a fastenc model (architectures: "
                        f"{', '.join(architecture.architectures())})")
    spec = architecture.get(arch)
    table: dict[str, tuple[str, int | None, str]] = {}
    for prefix in ("", spec.head_prefix):
        for fe, hs, kind in spec.entries(model.config, getattr(model, "task", "base"), prefix):
            if not fe.endswith(".weight"):
                continue
            for i, h in enumerate(hs):
                if h.endswith(".weight"):
                    table[h[:-len(".weight")]] = (fe[:-len(".weight")], i if kind == "qkv" else None, kind)
    return table


def _split_keys(state: dict[str, torch.Tensor], saved: list[str]):
    """({peft module: {"lora_A": A, "lora_B": B}}, {modules_to_save module: {"weight": W, "bias": b}});
    any other key is an error."""
    lora: dict[str, dict[str, torch.Tensor]] = {}
    full: dict[str, dict[str, torch.Tensor]] = {}
    bad = []
    for key, t in state.items():
        k = key[len("base_model.model."):] if key.startswith("base_model.model.") else key
        m = _KEY.match(k)
        if m is not None:
            lora.setdefault(m["mod"], {})[m["kind"]] = t
            continue
        k = re.sub(r"\.modules_to_save(\.[^.]+)?\.", ".", k)
        mod, _, leaf = k.rpartition(".")
        if leaf in ("weight", "bias") and any(mod.endswith(s) or f".{s}." in f".{mod}." for s in saved):
            full.setdefault(mod, {})[leaf] = t
            continue
        bad.append(key)
    if bad:
        joined = " ".join(bad)
        kinds = ("lora_embedding" in joined and "LoRA on embeddings" or
                 "lora_magnitude_vector" in joined and "DoRA magnitudes" or "tensors that are not LoRA weights")
        raise ValueError(f"load_lora: the adapter holds {kinds}, which fastenc does not support: {bad[:4]}"
                         f"{' ...' if len(bad) > 4 else ''}")
    if not lora and not full:
        raise ValueError("load_lora: the adapter holds no LoRA weights")
    return lora, full


def _linear_target(model, table, arch: str, peft_name: str, missing: list[str]):
    """(fastenc module name, Linear, third of Wqkv or None) for a PEFT module name, or None (added to missing)."""
    from fastenc.models import convert

    legacy = next(iter(convert.normalize_hf_names(arch, {peft_name + ".weight": None})))[:-len(".weight")]
    hit = table.get(peft_name) or table.get(legacy)
    if hit is None:
        missing.append(peft_name)
        return None
    fe_name, third, kind = hit
    try:
        module = model.get_submodule(fe_name)
    except AttributeError:
        module = None
    if kind == "patch" or not isinstance(module, Linear):
        raise ValueError(f"load_lora: target module {peft_name!r} is not a linear layer in fastenc's "
                         f"{type(model).__name__} (LoRA on convolutions, embeddings and norms is not supported)")
    return fe_name, module, third


def plan(model, config: dict, state: dict[str, torch.Tensor]) -> tuple[list[_Piece], list[_Full]]:
    """Validate an adapter against `model` and map it; raises before anything is changed."""
    check_config(config)
    table = target_table(model)
    arch, pieces, fulls, missing = _arch(model), [], [], []
    lora, full = _split_keys(state, list(config.get("modules_to_save") or []))
    for peft_name, wb in sorted(full.items()):
        hit = _linear_target(model, table, arch, peft_name, missing)
        if hit is None:
            continue
        fe_name, module, _ = hit
        w, b = wb.get("weight"), wb.get("bias")
        if w is None or tuple(w.shape) != tuple(module.weight.shape) or (b is None) != (module.bias is None) or (
                b is not None and tuple(b.shape) != tuple(module.bias.shape)):
            raise ValueError(f"load_lora: modules_to_save {peft_name!r}: weight {None if w is None else tuple(w.shape)}"
                             f", bias {None if b is None else tuple(b.shape)} do not fit the model's layer (weight "
                             f"{tuple(module.weight.shape)}, bias "
                             f"{None if module.bias is None else tuple(module.bias.shape)})")
        fulls.append(_Full(peft_name, fe_name, w, b))
    for peft_name, ab in sorted(lora.items()):
        if set(ab) != {"lora_A", "lora_B"}:
            raise ValueError(f"load_lora: module {peft_name!r} has {sorted(ab)} but needs both lora_A and lora_B")
        hit = _linear_target(model, table, arch, peft_name, missing)
        if hit is None:
            continue
        fe_name, module, third = hit
        a, b = ab["lora_A"], ab["lora_B"]
        if a.dim() != 2 or b.dim() != 2 or not a.is_floating_point() or not b.is_floating_point():
            raise ValueError(f"load_lora: {peft_name}: lora_A and lora_B must be 2-D float tensors, got "
                             f"{tuple(a.shape)} {a.dtype} and {tuple(b.shape)} {b.dtype}")
        out_rows = module.out_features // 3 if third is not None else module.out_features
        r = a.shape[0]
        if b.shape[1] != r:
            raise ValueError(f"load_lora: {peft_name}: rank mismatch between lora_A (r={r}) and lora_B "
                             f"(r={b.shape[1]})")
        want_r = _pattern(config.get("rank_pattern"), peft_name) or config["r"]
        if r != want_r:
            raise ValueError(f"load_lora: {peft_name}: lora_A has rank {r} but adapter_config says r={want_r}")
        if a.shape[1] != module.in_features or b.shape[0] != out_rows:
            raise ValueError(f"load_lora: {peft_name}: adapter shapes lora_A {tuple(a.shape)}, lora_B {tuple(b.shape)} "
                             f"do not fit the model's layer ({out_rows} out x {module.in_features} in): an adapter "
                             f"made for another hidden size or architecture?")
        alpha = _pattern(config.get("alpha_pattern"), peft_name) or config["lora_alpha"]
        scale = alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
        rows = slice(third * out_rows, (third + 1) * out_rows) if third is not None else slice(0, out_rows)
        pieces.append(_Piece(peft_name, fe_name, rows, a, b, float(scale)))
    if missing:
        known = sorted(k for k, v in table.items() if v[2] != "patch")
        raise ValueError(f"load_lora: target module(s) {missing[:4]}{' ...' if len(missing) > 4 else ''} do not exist "
                         f"in fastenc's {type(model).__name__} ({arch}); an adapter made for another architecture? "
                         f"Linear targets look like {known[:3]}")
    if {p.module for p in pieces} & {f.module for f in fulls}:
        raise ValueError("load_lora: a module is both a LoRA target and in modules_to_save")
    return pieces, fulls


def _check_finite(adapter: str, tensors: dict[str, torch.Tensor], op: str = "load_lora") -> None:
    """safe_merge: every tensor the adapter would write must be finite (NaN/inf named, nothing written)."""
    bad = [k for k, t in tensors.items() if not bool(torch.isfinite(t).all())]
    if bad:
        raise ValueError(f"{op}: safe_merge: adapter {adapter!r} produces non-finite (NaN/inf) weights in "
                         f"{bad[:4]}{' ...' if len(bad) > 4 else ''}; the model is unchanged")


def merged_values(model, pieces: list[_Piece], fulls: list[_Full],
                  new: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """{parameter name: value after merging} without writing anything: W[rows] + scale * B @ A (ops.merge_lora,
    fp32 accumulation, one rounding) per piece; a modules_to_save copy's weight and bias replace the layer's.
    Starts from `new` (the values of earlier merges, updated in place) or the model's current weights."""
    new = {} if new is None else new
    for p in pieces:
        pname = f"{p.module}.weight"
        if pname not in new:
            new[pname] = model.get_parameter(pname).detach().clone()
        w = new[pname]
        w[p.rows] = ops.merge_lora(w[p.rows], p.a.to(w.device), p.b.to(w.device), p.scale)
    for f in fulls:
        module = model.get_submodule(f.module)
        new[f"{f.module}.weight"] = f.weight.to(device=module.weight.device, dtype=module.weight.dtype)
        if f.bias is not None:
            new[f"{f.module}.bias"] = f.bias.to(device=module.bias.device, dtype=module.bias.dtype)
    return new


def write_merged(model, new: dict[str, torch.Tensor], st: _State, keep_originals: bool) -> None:
    """Copy merged values into the parameters (keep_originals: remember each one's value before its first merge,
    for unmerge_lora)."""
    with torch.no_grad():
        for pname, value in new.items():
            param = model.get_parameter(pname)
            if keep_originals:
                st.originals.setdefault(pname, param.detach().clone())
            param.copy_(value)


def _state(model) -> _State:
    st = model.__dict__.get("_lora_state")
    if st is None:
        st = _State()
        model.__dict__["_lora_state"] = st
    return st


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
        st = _state(self)
        if name in st.unmerged or name in st.merged:
            raise ValueError(f"load_lora: an adapter named {name!r} is already loaded "
                             f"({'merged' if name in st.merged else 'unmerged'}); pick another adapter_name")
        pieces, fulls = plan(self, config, state)
        if merge:
            new = merged_values(self, pieces, fulls)  # all computed before anything is written
            if safe_merge:
                _check_finite(name, new)
            write_merged(self, new, st, keep_originals=True)
            st.merged.append(name)
            return name
        ads = adapters_from_plan(self, pieces, fulls, trainable=is_trainable,
                                 dropout=float(config.get("lora_dropout") or 0.0))
        if safe_merge:
            _check_finite(name, {f"{m}.{k}": t for m, ad in ads.items() for k, t in ad.named_parameters()})
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
        st = _state(self)
        with torch.no_grad():
            for pname, orig in st.originals.items():
                param = self.get_parameter(pname)
                param.copy_(orig.to(device=param.device, dtype=param.dtype))
        st.originals.clear()
        st.merged.clear()

    def remove_lora(self, adapter_name: str | None = None) -> None:
        """Drop one unmerged adapter (or all with None); modules left without adapters become plain Linear."""
        st = _state(self)
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
        from fastenc.lora_train import merge_trained
        names = None if adapter_name is None else [adapter_name]
        return merge_trained(self, names, False, safe_merge, "merge_lora")[0]

    def merge_and_unload(self, adapter_names=None, safe_merge: bool = False):
        """PEFT's merge_and_unload: fold the active adapter (or the unmerged `adapter_names`, in order) into the
        base weights for good and remove every adapter, leaving a plain model whose save_pretrained writes a plain
        transformers checkpoint. Earlier merges (load_lora(merge=True), merge_lora) become permanent (nothing left
        for unmerge_lora). Base parameters keep their requires_grad (add_lora froze them, as PEFT does).
        Returns the model."""
        from fastenc.lora_train import merge_trained
        if adapter_names is not None and not isinstance(adapter_names, (list, tuple)):
            raise TypeError(f"merge_and_unload: adapter_names must be None or a list of adapter names, got "
                            f"{adapter_names!r}")
        merge_trained(self, None if adapter_names is None else list(adapter_names), True, safe_merge,
                      "merge_and_unload")
        return self

    def _check_adapter(self, name) -> None:
        if name is not None and name not in _state(self).unmerged:
            raise ValueError(f"adapter {name!r} is not loaded unmerged; loaded: {sorted(_state(self).unmerged)}")

    def set_adapter(self, adapter_name: str | None) -> None:
        """The unmerged adapter used by calls that do not name one (None: no adapter). As in PEFT, the active
        adapter is the one that trains (if it was added, or loaded with is_trainable=True); the others are frozen."""
        self._check_adapter(adapter_name)
        st = _state(self)
        st.default = adapter_name
        set_trainable(self, st)

    def add_lora(self, r: int = 8, lora_alpha: float = 16, target_modules=("query", "value"),
                 lora_dropout: float = 0.0, adapter_name: str = "default", modules_to_save=None,
                 use_rslora: bool = False) -> str:
        """A new trainable LoRA adapter, as PEFT's get_peft_model(model, LoraConfig(...)) makes it.

        target_modules: transformers module names (BERT query/key/value/dense, ModernBERT Wqkv/Wo/Wi, ViT
        q_proj/k_proj/v_proj/o_proj/fc1/fc2; a list entry matches a name ending in it, a str is a full-match regex).
        A (r, in): Kaiming-uniform (a=sqrt(5)); B (out, r): zeros; scale lora_alpha / r (use_rslora: / sqrt(r)).
        lora_dropout: on the adapter's input, train mode only. modules_to_save: Linear layers trained as full
        copies (None: the classifier for sequence/token classification models, qa_outputs for question
        answering, as PEFT's SEQ_CLS / TOKEN_CLS / QUESTION_ANS).
        Afterwards only this adapter's tensors require grad (every base parameter is frozen) and it is active.
        Returns the adapter name. Raises before any change on bad input (unknown target, r < 1, lora_alpha <= 0,
        a used adapter_name).
        """
        from fastenc.lora_train import add_lora
        return add_lora(self, r, lora_alpha, target_modules, lora_dropout, adapter_name, modules_to_save, use_rslora)

    def save_lora(self, folder, adapter_name: str | None = None):
        """Write adapter_config.json + adapter_model.safetensors (PEFT's names: base_model.model.<transformers
        module>.lora_A.weight, ...) for an unmerged adapter (default: the active one), which
        PeftModel.from_pretrained(hf_model, folder) and load_lora(folder) read. Returns the folder (a Path)."""
        from fastenc.lora_train import save_lora
        return save_lora(self, folder, adapter_name)

    @contextlib.contextmanager
    def use_adapter(self, adapter_name: str | None):
        """`with model.use_adapter("a"): model.encode(texts)` — this adapter (None: none) inside the block."""
        self._check_adapter(adapter_name)
        st = _state(self)
        token = st.active.set(adapter_name)
        try:
            yield self
        finally:
            st.active.reset(token)

    @property
    def lora_adapters(self) -> dict[str, Any]:
        st = _state(self)
        return {"merged": list(st.merged), "unmerged": sorted(st.unmerged), "active": st.current()}

    def __call__(self, *args, adapter=_KEEP, **kwargs):
        st = self.__dict__.get("_lora_state")
        if st is not None and st.merged and self.training and torch.is_grad_enabled():
            raise RuntimeError(f"{type(self).__name__}: adapter(s) {st.merged} are merged into the weights, so "
                               f"training would not reach them; call unmerge_lora() and load with merge=False (and "
                               f"is_trainable=True), or call eval() / torch.no_grad() for inference")
        if adapter is _KEEP:
            return super().__call__(*args, **kwargs)
        with self.use_adapter(adapter):
            return super().__call__(*args, **kwargs)
