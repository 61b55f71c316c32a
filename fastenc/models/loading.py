"""fastenc.from_hf (a transformers model object) and fastenc.from_pretrained (a local Hugging Face folder, read
without importing transformers): pick the architecture, build the config, apply the explicit weight map."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Mapping

import torch
from torch.overrides import TorchFunctionMode

from fastenc.files import read_json
from fastenc.models import architecture, convert, hub_configs



class _Supported(Mapping):
    """transformers class name -> (model_type, task), every head of every registered architecture (read from the
    architecture table on each use)."""

    def __getitem__(self, name):
        return architecture.hf_classes()[name]

    def __iter__(self):
        return iter(architecture.hf_classes())

    def __len__(self):
        return len(architecture.hf_classes())


SUPPORTED = _Supported()


def _unsupported(what: str) -> ValueError:
    return ValueError(f"unsupported architecture {what!r}; supported: {', '.join(SUPPORTED)}")


def _check_unexpected(arch: str, task: str, entries, hf_state: Mapping[str, torch.Tensor], prefix: str) -> None:
    """A tensor of a layer the config does not describe (the same name as a mapped tensor of another layer index,
    e.g. a third layer when num_hidden_layers is 2) means the config and the weights disagree: an error naming it.
    Other unread tensors (another head's, a pooler a head does not use, saved buffers, a mask token) are
    ignored, as transformers ignores them."""
    used = {h for _, hs, _ in entries for h in hs}
    shapes = {_LAYER.sub(".N.", h) for h in used}
    extra = [k for k in hf_state if k not in used and k.startswith(prefix) and _LAYER.sub(".N.", k) in shapes]
    if extra:
        raise ValueError(f"{arch} ({task}): unexpected weights {extra[:8]}{' ...' if len(extra) > 8 else ''} "
                         f"({len(extra)} in all): the checkpoint holds layers the config does not describe "
                         f"(check num_hidden_layers in config.json)")


_LAYER = re.compile(r"\.\d+\.")


_NORMAL = (torch.Tensor.normal_, torch.nn.init.normal_)


class SkipMetaInit(TorchFunctionMode):
    """Within it, normal_ (nn.init's or the tensor method) on a meta tensor does nothing. A model is loaded (`build`)
    by building the model on the meta device and assigning the checkpoint's weights, so its random init has no values
    to fill; but normal_ (the embeddings' init) has no C++ meta kernel, and the Python one imports torch._dynamo on
    first use: a model load in a fresh process (the CLI, each Ray actor) took 4-5 s with it and 0.9 s without on a
    busy 2-core machine. Tensors on other devices are untouched."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        t = args[0] if args else kwargs.get("tensor")  # nn.init.normal_ passes it by keyword
        if func in _NORMAL and isinstance(t, torch.Tensor) and t.is_meta:
            return t
        return func(*args, **kwargs)


def build(arch: str, task: str, cfg, hf_state: Mapping[str, torch.Tensor], prefix: str = "", copy: bool = True,
          device=None, dtype=None):
    """fastenc model of (arch, task) holding `hf_state`'s weights (mapped); complete or an error, never partial."""
    spec = architecture.get(arch)
    entries = spec.entries(cfg, task, prefix)
    _check_unexpected(arch, task, entries, hf_state, prefix)
    try:
        state = convert.hf_to_fastenc(entries, hf_state, cfg)
    except KeyError as e:
        raise ValueError(f"{arch} ({task}): {e.args[0]}") from None
    except ValueError as e:
        raise ValueError(f"{arch} ({task}): {e}") from None
    if copy:  # every tensor sharing memory with the checkpoint's (views such as the reshaped patch weight too)
        shared = {t.untyped_storage().data_ptr() for t in hf_state.values() if t.device.type != "meta"}
        state = {k: v.detach().clone() if v.device.type != "meta" and v.untyped_storage().data_ptr() in shared
                 else v for k, v in state.items()}
    with torch.device("meta"), SkipMetaInit():
        model = spec.model_class(task)(cfg)
    expected = dict(model.state_dict())
    for fe, hs, kind in entries:
        v = state[fe]
        if tuple(v.shape) != tuple(expected[fe].shape):
            want = tuple(expected[fe].shape)
            if kind == "patch":  # the conv weight, as the checkpoint holds it
                want = (want[0], cfg.num_channels, cfg.patch_size, cfg.patch_size)
                v = hf_state[hs[0]]
            raise ValueError(f"{arch}: weight {hs[0] if len(hs) == 1 or kind == 'scale' else fe} must have shape {want}, got "
                             f"{tuple(v.shape)}")
    model.load_state_dict(state, strict=True, assign=True)
    model.eval()  # (as transformers' from_pretrained; the parameters require grad, as there)
    if device is not None or dtype is not None:
        model = model.to(device=device, dtype=dtype)
    return model


def from_hf(hf_model, copy: bool = True):
    """fastenc model equivalent to a transformers model object (same device and dtype).

    Accepts every transformers class of the architecture table (`SUPPORTED`: BertModel,
    BertForSequenceClassification, ..., ViTForImageClassification).
    copy=False shares every tensor that needs no conversion with `hf_model` (only fused QKV is new).
    """
    name = next((c.__name__ for c in type(hf_model).__mro__ if c.__name__ in SUPPORTED), None)
    if name is None:
        raise _unsupported(type(hf_model).__name__)
    arch, task = SUPPORTED[name]
    spec = architecture.get(arch)
    d = hf_model.config.to_dict()
    extra = spec.overrides(task, getattr(hf_model, "pooler", None) is not None)
    cfg = spec.config.from_dict(d, **extra)
    model = build(arch, task, cfg, hf_model.state_dict(), spec.prefix(task), copy=copy)
    folder = getattr(hf_model, "name_or_path", None) or getattr(hf_model.config, "_name_or_path", None)
    if folder and "text" in spec.modalities and hasattr(model, "load_tokenizer") and Path(folder).is_dir():
        model.load_tokenizer(folder)
    return model


class _UnsafeShard(ValueError):
    pass


def _shard_files(folder: Path, idx: Path) -> list[Path]:
    """The shard files a model.safetensors.index.json names: plain file names inside the model folder only."""
    index = json.loads(idx.read_text())
    wmap = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(wmap, dict) or not all(isinstance(f, str) for f in wmap.values()):
        raise ValueError("weight_map must be an object of tensor name -> shard file name")
    root = folder.resolve()
    out = []
    for f in sorted(set(wmap.values())):
        path = (folder / f).resolve()
        if Path(f).is_absolute() or ".." in Path(f).parts or path.parent != root:
            raise _UnsafeShard(f"from_pretrained: {idx} names the shard {f!r}, which is not a file inside the model "
                               f"folder {folder}; refusing to read it")
        out.append(path)
    return out


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    st, idx, pt = folder / "model.safetensors", folder / "model.safetensors.index.json", folder / "pytorch_model.bin"
    try:
        if st.is_file():
            from safetensors.torch import load_file
            return load_file(str(st))
        if idx.is_file():
            from safetensors.torch import load_file
            state: dict[str, torch.Tensor] = {}
            for f in _shard_files(folder, idx):
                state.update(load_file(str(f)))
            return state
        if pt.is_file():
            state = torch.load(str(pt), map_location="cpu", weights_only=True)
            if not isinstance(state, dict):
                raise ValueError(f"expected a state dict, got {type(state).__name__}")
            return state
    except _UnsafeShard:
        raise
    except Exception as e:  # corrupt or truncated file: one clear error, nothing loaded
        bad = st if st.is_file() else idx if idx.is_file() else pt
        raise ValueError(f"from_pretrained: cannot read weights from {bad}: {type(e).__name__}: {e}") from None
    raise FileNotFoundError(f"from_pretrained: no weights in {folder} (expected model.safetensors, "
                            f"model.safetensors.index.json or pytorch_model.bin)")


def from_pretrained(path, device=None, dtype=None):
    """fastenc model from a local Hugging Face folder (config.json + model.safetensors or pytorch_model.bin).

    Does not import transformers. Loads tokenizer.json and sentence-transformers settings when present.
    Defaults: fp32 on CPU, fp16 on CUDA.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"from_pretrained: {folder} is not a directory")
    cfg_file = folder / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"from_pretrained: {cfg_file} not found")
    d = read_json(cfg_file, "from_pretrained", what=" (a config)")
    d = hub_configs.translate(d, cfg_file)  # an original GTE / NomicBERT hub config -> transformers' names
    archs = d.get("architectures") or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise ValueError(f"from_pretrained: {cfg_file}: architectures must be a list of class names, got {archs!r}")
    name = archs[0] if archs else None
    heads, encoders = architecture.hf_classes(), architecture.encoder_classes()
    if name in heads:
        arch, task = heads[name]
    elif name in encoders:
        arch, task = encoders[name], "base"
    elif name is None and d.get("model_type") in architecture.architectures():
        arch, task = d["model_type"], "base"
    else:
        raise _unsupported(name or d.get("model_type"))
    spec = architecture.get(arch)
    state = convert.normalize_hf_names(arch, _read_weights(folder))
    prefix = ""
    if task != "base" or not any(k.startswith(("embeddings.",)) for k in state):
        prefix = spec.head_prefix
    has_pooler = any(f"{prefix}pooler.{n}weight" in state for n in ("dense.", ""))  # (ALBERT's is pooler.*)
    extra = spec.overrides(task, has_pooler)
    cfg = spec.config.from_dict(d, **extra)
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dtype is None:
        dtype = torch.float32 if dev.type == "cpu" else torch.float16
    model = build(arch, task, cfg, state, prefix, copy=False, device=dev, dtype=dtype)
    if "text" in spec.modalities and hasattr(model, "load_tokenizer"):  # (not an image-only head of a two-tower one)
        model.load_tokenizer(folder)
    if spec.modality == "text":
        from fastenc.models.bge_m3 import load_heads

        load_heads(model, folder)  # BGE-M3's sparse / colbert heads, where the folder has them
    return model
