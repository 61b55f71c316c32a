"""The int8 mode of `fastenc bench models` (--quantize int8): its providers, what the results record about them
and the machine's int8 path, and each provider's accuracy against fp32 transformers."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import torch

from fastenc.benchmark import int8_accuracy, int8_peers

MODES = ("int8",)
# the int8 peers: "the best int8 peer" of a workload is the fastest of these that ran in it
PEERS = ("onnxruntime-int8", "torch-dynamic-int8", "ctranslate2-int8", "ctranslate2-int8_float32", "openvino-int8")
PROVIDERS = ("fastenc", "fastenc-int8", "hf-sdpa", "onnxruntime-fp32", "onnxruntime-int8", "torch-dynamic-int8",
             "ctranslate2-int8", "openvino-int8")  # the default set, in timing order
KNOWN = PROVIDERS + ("ctranslate2-int8_float32", "hf-eager", "hf-compile")
BASELINES = ("fastenc", "hf-sdpa", "onnxruntime-fp32")  # the rows' ratio_vs_<b>; fastenc fp32 first
NOT_RUN = {"ctranslate2-int8_float32": "not run unless --providers names it: on the CPU CTranslate2's int8_float32 "
                                       "runs the same kernels as int8 (bit-identical outputs), so it would time "
                                       "ctranslate2-int8 a second time"}
CPU_FLAGS = ("avx2", "avx512_vnni", "amx_int8")
PASSAGES = {"quick": 200, "full": 2000}
IMAGES = {"quick": 8, "full": 64}
NUM_LABELS = 4  # the random classification heads' classes (as many as the fine-tuning example's)
FINETUNED = ("minilm",)  # the models whose classifier is the fine-tuning example's (fastenc finetune)


def fastenc_int8(model: torch.nn.Module) -> torch.nn.Module:
    """fastenc.quantize(model, "int8") of a fastenc fp32 model on the CPU, in eval mode."""
    import fastenc

    return fastenc.quantize(model.eval(), "int8")


def describe(name: str) -> str:
    """One line: what provider `name` of the int8 mode runs."""
    import transformers

    if name == "fastenc":
        return "fastenc fp32 (fastenc.from_hf), the baseline of the int8 ratios"
    if name == "fastenc-int8":
        return ("fastenc.quantize(model, 'int8'): the encoder's Linears on int8 weights per output channel, "
                "activations quantized per row at run time (asymmetric), fastenc's int8 GEMM on the "
                f"{_isa()} path; embeddings, norms, attention and heads fp32")
    if name == "hf-sdpa":
        return f"transformers {transformers.__version__} fp32, attn_implementation='sdpa' (the accuracy reference)"
    if name in ("hf-eager", "hf-compile"):
        return f"transformers {transformers.__version__} fp32, {name[3:]}"
    return int8_peers.describe(name)


def _isa() -> str:
    from fastenc.quant import isa

    return isa.chosen()


def machine() -> dict:
    """The int8 facts of the machine section: the int8 GEMM's path now (fastenc.quant.isa.chosen()), whether
    FASTENC_INT8_ISA forced it, each path's availability, and the CPU flags that decide it."""
    from fastenc.benchmark import report
    from fastenc.quant import isa

    return {"int8_isa": isa.chosen(), "int8_isa_env": os.environ.get(isa.ENV) or None,
            "int8_isas": {k: v or "available" for k, v in isa.available().items()},
            "cpu_flags": report.cpu_flags(CPU_FLAGS)}


def model_info() -> dict:
    """What one model's results record of the int8 path it ran (from the process that ran it)."""
    from fastenc.quant import isa

    return {"isa": isa.chosen(), "isa_env": os.environ.get(isa.ENV) or None}


def accuracy(spec, hf_model, fns: dict, *, quick: bool, threads: int, workdir: Path,
             log: Callable[[str], None] = print, texts: list[str] | None = None) -> dict:
    """Each provider of `fns` (name -> fn(inputs) -> last hidden state) against hf_model (fp32 transformers, the
    reference): embeddings (mean-pooled, L2-normalized; cosine min/mean) and a classification head's top-1
    agreement over the same batches. Text: `texts` (docstring passages; None: read PASSAGES of them), MiniLM's
    tokenizer for a checkpoint with a folder, else random ids at those lengths; the head: for FINETUNED the
    fine-tuning example's classifier (int8_finetuned, with its held-out accuracy; a random head where that fails),
    else a random classifier of the architecture. Vision: IMAGES random images and a random image classifier."""
    import transformers

    from fastenc.models import architecture

    mode = "quick" if quick else "full"
    arch = architecture.get(hf_model.config.model_type)
    out: dict = {"reference": f"transformers {transformers.__version__} fp32 (sdpa), the same model", "skipped": {}}
    if spec.kind == "text":
        if texts is None:
            texts, source = int8_accuracy.passages(PASSAGES[mode])
        else:
            source = f"{len(texts)} docstring passages, as the results' accuracy_passages says"
        ids, tokens = _token_ids(spec, hf_model, texts)
        batches = int8_accuracy.token_batches(ids, pad_id=getattr(hf_model.config, "pad_token_id", None) or 0)
        inputs = {"n": len(texts), "passages": source, "tokens": tokens}
    else:
        size = getattr(hf_model.config, "image_size", 224)
        batches = int8_accuracy.image_batches(IMAGES[mode], size, getattr(hf_model.config, "num_channels", 3))
        inputs = {"n": IMAGES[mode], "images": f"{IMAGES[mode]} random images {size}x{size}, N(0, 1) pixels, seed 0"}
    ft = None
    if spec.kind == "text" and spec.name in FINETUNED:
        from fastenc.benchmark import int8_finetuned

        try:
            ft = int8_finetuned.evaluate(list(fns), texts, threads, workdir, log)  # the providers that ran
        except Exception as e:  # noqa: BLE001  (the embeddings and a random head are still measured)
            out["skipped"]["finetuned classifier"] = f"{type(e).__name__}: {str(e).strip()[:300]}"
            log(f"accuracy: the fine-tuned classifier failed ({out['skipped']['finetuned classifier']}); "
                "a random head instead")
    head, head_desc = (None, None) if ft else int8_accuracy.random_head(arch, hf_model.config, NUM_LABELS)
    providers = {n: f for n, f in fns.items() if n != "hf-sdpa"}

    def reference(x):
        with torch.inference_mode():
            return hf_model(**x).last_hidden_state

    log(f"accuracy: {len(providers)} providers on {inputs['n']} {'passages' if spec.kind == 'text' else 'images'}")
    agree, failed = int8_accuracy.agreement(providers, reference, batches, head=head)
    out["skipped"].update(failed)
    out["embeddings"] = {**inputs, "pooling": "mean over real tokens, L2-normalized",
                         "providers": {n: {k: r[k] for k in ("cos_min", "cos_mean", "n")} for n, r in agree.items()}}
    if head is not None:
        out["classification"] = {"head": head_desc, "n": inputs["n"], "providers": {
            n: {k: r[k] for k in ("top1_agreement", "max_abs_logit_diff", "n")} for n, r in agree.items()}}
    else:
        out["finetuned"] = ft
        out["classification"] = {"head": ft["head"], "n": len(texts), "providers": ft.get("passages", {})}
    out["summary"] = summary(out)
    return out


def _token_ids(spec, hf_model, texts: list[str]) -> tuple[list[list[int]], str]:
    """Token ids of `texts`: the checkpoint's tokenizer (truncated at int8_accuracy.MAX_LENGTH) for a model with a
    folder, else random ids in [1000, vocab) at the lengths MiniLM's tokenizer gives them; with how they were made."""
    from transformers import AutoTokenizer

    n = int8_accuracy.MAX_LENGTH
    if spec.folder is not None:
        ids = int8_accuracy.tokenize(texts, AutoTokenizer.from_pretrained(spec.folder()), n)
        return ids, f"the checkpoint's tokenizer, truncated at {n} tokens"
    lengths, how = int8_accuracy.token_lengths(texts, n)
    vocab = hf_model.config.vocab_size
    return (int8_accuracy.random_ids(lengths, vocab, seed=0),
            f"random ids in [{min(1000, vocab // 2)}, {vocab}) (seed 0) at {how}: random weights, so the text "
            "itself carries nothing")


def summary(acc: dict) -> dict:
    """provider -> {emb_cos_min, emb_cos_mean, top1_agreement, heldout_accuracy, unseen_accuracy} (those measured)."""
    out: dict = {}
    for n, r in acc.get("embeddings", {}).get("providers", {}).items():
        out.setdefault(n, {}).update(emb_cos_min=r["cos_min"], emb_cos_mean=r["cos_mean"])
    for n, r in acc.get("classification", {}).get("providers", {}).items():
        out.setdefault(n, {})["top1_agreement"] = r["top1_agreement"]
    for part in ("heldout", "unseen"):
        for n, a in acc.get("finetuned", {}).get(part, {}).get("accuracy", {}).items():
            out.setdefault(n, {})[f"{part}_accuracy"] = a
    return out


def annotate(rows: list[dict], lat_rows: list[dict], acc: dict | None) -> None:
    """Copy each provider's accuracy summary into its throughput and latency rows (speed beside accuracy)."""
    summ = (acc or {}).get("summary", {})
    for r in rows + lat_rows:
        r.update(summ.get(r["provider"], {}))
