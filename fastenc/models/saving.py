"""model.save_pretrained(folder): a transformers-layout folder (config.json + model.safetensors) through the inverse
weight map, which transformers' from_pretrained (and fastenc.from_pretrained) loads with the same weights.

When the model has a tokenizer (read from a folder's tokenizer.json), the tokenizer's files of that folder are
copied beside the weights, so transformers' AutoTokenizer and fastenc.from_pretrained load the saved folder whole.
The config is the Hugging Face config the model was read from (its dropouts, labels and problem type updated), or,
for a model built from a fastenc config, one made from the fastenc fields (ModernBERT's RoPE thetas as
rope_parameters per layer type).

Every file is written under a temporary name in the destination folder and renamed when all are complete
(write_files); a failure removes the temporary files, leaves any earlier file of the same name as it was, and
raises a SaveError (an OSError) naming the operation, the folder, the file and the OS's reason.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import shutil
from pathlib import Path

import torch

from fastenc.models import architecture, convert

# The files of a tokenizer (transformers' AutoTokenizer reads them beside tokenizer.json), copied when present.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.txt", "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model",
                   "tokenizer.model")
# sentence-transformers settings encode() reads (pooling, normalization, max length): copied for base models only.
ENCODER_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json",
                 "1_Pooling/config.json")
# fastenc fields with no transformers config key of the same meaning.
_FASTENC_ONLY = {"hf_config", "add_pooling_layer", "rope_theta_global", "rope_theta_local"}


def hf_config_dict(cfg, arch: str, task: str, dtype: torch.dtype) -> dict:
    """The config.json of a saved model (JSON-serializable)."""
    spec = architecture.get(arch)
    mine = {k: v for k, v in dataclasses.asdict(cfg).items()
            if k not in _FASTENC_ONLY and k not in getattr(cfg, "FASTENC_ONLY", ())}
    if spec.hf_config is not None:
        mine.update(spec.hf_config(cfg))
    out = dict(cfg.hf_config) if cfg.hf_config is not None else {}
    out.update(mine)
    labels = cfg.id2label or {i: f"LABEL_{i}" for i in range(cfg.num_labels)}
    out["id2label"] = {str(k): v for k, v in labels.items()}
    out["label2id"] = {v: int(k) for k, v in labels.items()}
    out["architectures"] = [spec.hf_class(task)]
    out["model_type"] = arch
    out["dtype"] = str(dtype).removeprefix("torch.")
    out.pop("torch_dtype", None)
    return json.loads(json.dumps(out, default=str))


class SaveError(OSError):
    """Writing a saved model, tokenizer or adapter failed: the message names the operation, the folder, the file
    and the OS's reason (errno and filename as the OS gave them, when it did)."""

    def __init__(self, message: str, errno: int | None = None, filename: str | None = None):
        super().__init__(message)
        self.message, self.errno, self.filename = message, errno, filename

    def __str__(self) -> str:
        return self.message


def _reason(e: BaseException) -> str:
    if isinstance(e, OSError):
        return e.strerror or str(e) or type(e).__name__
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def write_files(op: str, folder, writers: dict) -> Path:
    """Write files into `folder` (created if needed): writers maps a file name (relative, may hold a subfolder)
    to write(path: str) that writes it whole. Each is written as .<name>.tmp beside its final name, then all are
    renamed. On any failure (an OSError, or safetensors' own error on a failed write) the temporary files are
    removed, no final name is touched, and a SaveError names op, the folder, the file and the reason."""
    folder = Path(folder)
    done: list[tuple[Path, Path]] = []
    name = "."
    try:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            for name, write in writers.items():
                dest = folder / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                tmp = dest.with_name(f".{dest.name}.tmp")
                done.append((tmp, dest))
                with open(tmp, "wb"):  # the OS answers here (permissions, read-only, full) before the work
                    pass
                write(str(tmp))
            for tmp, dest in done:
                name = str(dest.relative_to(folder))
                os.replace(tmp, dest)
        except Exception as e:
            if not isinstance(e, OSError) and type(e).__name__ != "SafetensorError":
                raise
            raise SaveError(f"{op}: cannot write {name} into {folder}: {_reason(e)}", getattr(e, "errno", None),
                            str(folder / name)) from None
    except BaseException:
        for tmp, _ in done:
            with contextlib.suppress(OSError):
                tmp.unlink()
        raise
    return folder


class SaveMixin:
    """save_pretrained for the fastenc models (config.model_type, task and the architecture's weight map)."""

    def save_pretrained(self, folder) -> Path:
        """Write config.json and model.safetensors under transformers' names into `folder` (created if needed);
        both files are written under temporary names first and renamed when complete (a failure raises a SaveError
        naming the folder and the reason, and leaves no partial file under a final name). Returns the folder.
        A model carrying unmerged LoRA adapters is refused (merge_and_unload() first)."""
        from safetensors.torch import save_file

        lora = self.__dict__.get("_lora_state")
        if lora is not None and lora.unmerged:  # its weights alone would be the model without the adapters
            raise ValueError(f"save_pretrained: {type(self).__name__} carries unmerged LoRA adapter(s) "
                             f"{sorted(lora.unmerged)}; call merge_and_unload() to save the adapted model, "
                             f"save_lora(folder) to save an adapter, or remove_lora() to save the base model")
        cfg, arch, task = self.config, self.config.model_type, self.task
        entries = architecture.get(arch).entries(cfg, task)
        with torch.no_grad():
            state = {k: v.detach() for k, v in self.state_dict().items()}
            hf = convert.fastenc_to_hf(entries, state, cfg)
            hf = {k: v.to("cpu").contiguous().clone() for k, v in hf.items()}  # (safetensors: no shared memory)
        dtype = next(iter(hf.values())).dtype
        config = hf_config_dict(cfg, arch, task, dtype)
        folder = Path(folder)
        text = json.dumps(config, indent=2, sort_keys=True) + "\n"
        write_files("save_pretrained", folder, {
            "model.safetensors": lambda path: save_file(hf, path, metadata={"format": "pt"}),
            "config.json": lambda path: Path(path).write_text(text)})
        save_tokenizer(self, folder)
        return folder


def save_tokenizer(model, folder: Path) -> list[str]:
    """Copy the tokenizer files (and, for a base model, the encoder settings) of the folder the model's tokenizer
    was read from into `folder`, each under a temporary name renamed when complete; tokenizer.json is written from
    the loaded tokenizer when that folder no longer has it. Returns the names written (none without a tokenizer)."""
    tok = getattr(model, "tokenizer", None)
    src = getattr(model, "tokenizer_folder", None)
    if tok is None or (src is not None and src.is_dir() and src.samefile(folder)):
        return []
    writers = {}
    for name in TOKENIZER_FILES + (ENCODER_FILES if model.task == "base" else ()):
        if src is not None and (src / name).is_file():
            writers[name] = functools.partial(lambda s, path: shutil.copyfile(s, path), src / name)
        elif name == "tokenizer.json":
            writers[name] = functools.partial(_write_tokenizer, tok)
    write_files("save_pretrained (tokenizer)", folder, writers)
    return list(writers)


def _write_tokenizer(tok, path: str) -> None:
    from tokenizers import Tokenizer

    plain = Tokenizer.from_str(tok.to_str())  # without the truncation encode() sets
    plain.no_truncation()
    plain.no_padding()
    plain.save(path)
