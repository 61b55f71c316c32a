"""PEFT LoRA adapter files on fastenc models: read an adapter (PEFT's adapter_config.json +
adapter_model.safetensors, or a PeftModel), validate and map it onto a model, compute and write merged weights.

PEFT module names map onto fastenc's modules through the weight maps of the architecture table
(fastenc.models.architecture), so a query/key/value adapter lands on its third of the fused Wqkv rows. Supported: r,
lora_alpha, use_rslora, rank_pattern/alpha_pattern, bias="none", modules_to_save Linear copies (e.g. a SEQ_CLS
classifier head). Everything is validated before the model is touched (`plan`). `State` is the per-model
bookkeeping that the trainable adapters (fastenc.lora_train) and the model methods (fastenc.lora) share.
"""
from __future__ import annotations

import contextvars
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from fastenc import ops
from fastenc.files import read_json
from fastenc.layers.linear import Linear

SCALE_NAME = "scale = lora_alpha / r (use_rslora: lora_alpha / sqrt(r))"
KEEP = object()
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
class Piece:
    """One PEFT LoRA module mapped onto fastenc: rows `rows` of the Linear `module` get scale * B @ A."""
    peft_name: str
    module: str
    rows: slice
    a: torch.Tensor
    b: torch.Tensor
    scale: float


@dataclass
class Full:
    """A PEFT modules_to_save Linear (a fully trained copy, e.g. a classifier head): replaces weight and bias."""
    peft_name: str
    module: str
    weight: torch.Tensor
    bias: torch.Tensor | None


@dataclass
class State:
    """Per-model LoRA bookkeeping (plain attributes: not parameters, not in state_dict)."""
    originals: dict[str, torch.Tensor] = field(default_factory=dict)   # parameter -> value before any merge
    merged: list[str] = field(default_factory=list)                      # merged adapter names, in order
    unmerged: dict[str, list[str]] = field(default_factory=dict)        # adapter -> modules it routes
    default: str | None = None                                          # set_adapter()
    trainable: set = field(default_factory=set)                          # adapters that train while active
    configs: dict[str, dict] = field(default_factory=dict)               # adapter -> its PEFT config (save_lora)
    active: contextvars.ContextVar = field(default_factory=lambda: contextvars.ContextVar("fastenc_lora",
                                                                                         default=KEEP))

    def current(self) -> str | None:
        name = self.active.get()
        return self.default if name is KEEP else name


# ---------------------------------------------------------------- reading an adapter

def read_adapter(source, peft_adapter: str | None = None) -> tuple[dict, dict[str, torch.Tensor], str]:
    """(config dict, {key: tensor}, adapter name) from a PEFT adapter folder or a PeftModel (its adapter
    `peft_adapter`, default its active one)."""
    if isinstance(source, (str, Path)):
        folder = Path(source)
        cfg_path = folder / "adapter_config.json"
        if not cfg_path.is_file():
            raise FileNotFoundError(f"load_lora: {folder} has no adapter_config.json (expected a PEFT adapter folder)")
        config = read_json(cfg_path, "load_lora")
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
    if kind == "cat":
        raise ValueError(f"load_lora: target module {peft_name!r} is one part of a fused projection in fastenc's "
                         f"{type(model).__name__} (LoRA there is not supported; target the attention projections)")
    if kind == "scale":
        raise ValueError(f"load_lora: target module {peft_name!r} is followed by a layer scale that fastenc folds into "
                         f"its weights ({type(model).__name__}); LoRA on it is not supported: target the attention's "
                         f"q_proj / k_proj / v_proj or the MLP's first projection(s) instead")
    if kind == "patch" or not isinstance(module, Linear):
        raise ValueError(f"load_lora: target module {peft_name!r} is not a linear layer in fastenc's "
                         f"{type(model).__name__} (LoRA on convolutions, embeddings and norms is not supported)")
    return fe_name, module, third


def plan(model, config: dict, state: dict[str, torch.Tensor]) -> tuple[list[Piece], list[Full]]:
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
        fulls.append(Full(peft_name, fe_name, w, b))
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
        pieces.append(Piece(peft_name, fe_name, rows, a, b, float(scale)))
    if missing:
        known = sorted(k for k, v in table.items() if v[2] not in ("patch", "scale"))
        raise ValueError(f"load_lora: target module(s) {missing[:4]}{' ...' if len(missing) > 4 else ''} do not exist "
                         f"in fastenc's {type(model).__name__} ({arch}); an adapter made for another architecture? "
                         f"Linear targets look like {known[:3]}")
    if {p.module for p in pieces} & {f.module for f in fulls}:
        raise ValueError("load_lora: a module is both a LoRA target and in modules_to_save")
    return pieces, fulls


def check_finite(adapter: str, tensors: dict[str, torch.Tensor], op: str = "load_lora") -> None:
    """safe_merge: every tensor the adapter would write must be finite (NaN/inf named, nothing written)."""
    bad = [k for k, t in tensors.items() if not bool(torch.isfinite(t).all())]
    if bad:
        raise ValueError(f"{op}: safe_merge: adapter {adapter!r} produces non-finite (NaN/inf) weights in "
                         f"{bad[:4]}{' ...' if len(bad) > 4 else ''}; the model is unchanged")


def merged_values(model, pieces: list[Piece], fulls: list[Full],
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


def write_merged(model, new: dict[str, torch.Tensor], st: State, keep_originals: bool) -> None:
    """Copy merged values into the parameters (keep_originals: remember each one's value before its first merge,
    for unmerge_lora)."""
    with torch.no_grad():
        for pname, value in new.items():
            param = model.get_parameter(pname)
            if keep_originals:
                st.originals.setdefault(pname, param.detach().clone())
            param.copy_(value)


def state_of(model) -> State:
    st = model.__dict__.get("_lora_state")
    if st is None:
        st = State()
        model.__dict__["_lora_state"] = st
    return st
