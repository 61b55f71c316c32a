"""The fine-tuning example's classifier (`fastenc finetune`, trained once and cached) in fp32 and int8: held-out
accuracy and top-1 agreement with fp32 transformers, for `fastenc bench models --quantize int8`."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Callable

import torch

from fastenc.benchmark import int8_accuracy, int8_peers

SETTINGS = ("fastenc.finetune.finetune() defaults: full fine-tuning of all-MiniLM-L6-v2, 3 epochs, 100 docstrings "
            "per class (email, asyncio, unittest, xml), batch 16, AdamW lr 5e-5, max length 128, seed 0")
PER_CLASS, SEED = 100, 0  # the example's defaults, which fix its train / held-out split


def _cache_root() -> Path:
    return Path(os.environ.get("FASTENC_CACHE_DIR", Path.home() / ".cache" / "fastenc"))


def classifier(workdir: Path, log: Callable[[str], None] = print) -> tuple[Path, dict]:
    """The example's trained classifier: (its folder, transformers layout with the tokenizer; what made it). Trained
    once per version of fastenc/finetune.py, torch and transformers into $FASTENC_CACHE_DIR (or ~/.cache/fastenc)
    /finetuned/, and reused; FASTENC_BENCH_NO_CACHE=1 trains it into `workdir` instead."""
    import transformers

    from fastenc import finetune

    src = Path(finetune.__file__).read_bytes()
    key = hashlib.sha1(src + f"|{torch.__version__}|{transformers.__version__}".encode()).hexdigest()[:16]
    no_cache = os.environ.get("FASTENC_BENCH_NO_CACHE", "0") not in ("", "0")
    folder = Path(workdir) / "finetuned" if no_cache else _cache_root() / "finetuned" / f"minilm-{key}"
    record = folder / "bench.json"
    if record.exists():
        log(f"finetuned classifier from cache {folder}")
        return folder, {**json.loads(record.read_text()), "folder": str(folder), "cached": True}
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    log(f"training the fine-tuning example's classifier ({SETTINGS}) ...")
    t0 = time.perf_counter()
    res = finetune.finetune(out=tmp, progress=False, log=lambda m: log(f"finetune: {m}"))
    made = {"settings": SETTINGS, "example_heldout_accuracy": res["accuracy"],
            "accuracy_before_training": res["accuracy_before"], "chance": res["chance"],
            "reload_max_diff": res["reload_max_diff"], "train_s": round(time.perf_counter() - t0, 1),
            "key": key}
    (tmp / "bench.json").write_text(json.dumps(made, indent=1) + "\n")
    try:
        tmp.rename(folder)
    except OSError:  # another run got there first: keep its folder
        shutil.rmtree(tmp, ignore_errors=True)
    return folder, {**made, "folder": str(folder), "cached": False}


def evaluation_sets() -> dict[str, tuple[list[str], list[int], str]]:
    """{"heldout": the example's own held-out 20% (texts, labels, what), "unseen": every other docstring of the four
    packages the example never drew (neither trained on nor held out), same lengths and labels}."""
    from fastenc import finetune

    texts, labels = finetune.labelled_passages(PER_CLASS, SEED)
    cut = max(1, len(texts) // 5)  # as finetune.finetune splits them
    drawn = set(texts)
    by_pkg = {p: set(finetune._package_docs(p, 40, 1500)) for p in finetune.PACKAGES}
    unseen_x, unseen_y = [], []
    for label, pkg in enumerate(finetune.PACKAGES):
        others = set().union(*(d for p, d in by_pkg.items() if p != pkg))
        for d in sorted(by_pkg[pkg] - drawn - others):
            unseen_x.append(d)
            unseen_y.append(label)
    return {"heldout": (texts[:cut], labels[:cut], f"the example's held-out split ({cut} of {len(texts)} drawn "
                        f"docstrings, {PER_CLASS} per class, seed {SEED})"),
            "unseen": (unseen_x, unseen_y, "the four packages' other docstrings (40-1500 characters) that the "
                       "example never drew")}


def _logits(model) -> Callable[[dict], torch.Tensor]:
    def run(inputs):
        with torch.inference_mode():
            out = model(inputs["input_ids"], inputs["attention_mask"])
        return out if isinstance(out, torch.Tensor) else out.logits
    return run


def build(folder: Path, wanted: list[str], threads: int, workdir: Path, log: Callable[[str], None] = print):
    """(reference fn, {provider: fn(inputs) -> logits (batch, labels)}, {provider: why skipped}, head description,
    tokenizer) for the classifier in `folder`: fastenc and fastenc-int8 are fastenc.from_pretrained's whole
    classifier, the peers run its encoder with its fp32 head (int8_accuracy.Head) on their last hidden states."""
    import transformers

    import fastenc
    from fastenc.models import architecture

    clf = transformers.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    clf.set_attn_implementation("sdpa")
    head = int8_accuracy.Head(clf, architecture.get(clf.config.model_type))
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    enc = tok(["A check of the head.", "Two sentences, one padded batch."], padding=True, return_tensors="pt")
    diff = head.check({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]})
    fns, skipped = {}, {}
    for name in wanted:
        if name in ("hf-sdpa", "hf-eager", "hf-compile"):
            continue
        try:
            if name in ("fastenc", "fastenc-int8"):
                quant = "int8" if name == "fastenc-int8" else None
                fns[name] = _logits(fastenc.from_pretrained(str(folder), quantize=quant).eval())
            elif name in int8_peers.PEERS:
                enc_fn = int8_peers.build(name, head.encoder, "text", threads, Path(workdir) / "finetuned-peers",
                                          lambda m: log(f"finetuned {m}"))
                fns[name] = lambda inputs, f=enc_fn: head(f(inputs), inputs)
            else:
                skipped[name] = f"unknown provider {name!r}"
        except Exception as e:  # noqa: BLE001  (a provider that cannot run the classifier is skipped, with why)
            skipped[name] = str(e) if isinstance(e, int8_peers.PeerUnavailable) else f"{type(e).__name__}: {e}"[:300]

    def reference(inputs):
        with torch.inference_mode():
            return clf(**inputs).logits
    desc = (f"the fine-tuning example's classifier ({type(clf).__name__}); the peers run its encoder with its fp32 "
            f"pooler and classifier on top (checked against the whole model: {diff:.1e})")
    return reference, fns, skipped, desc, tok


def evaluate(wanted: list[str], texts: list[str], threads: int, workdir: Path, log: Callable[[str], None] = print,
             folder: Path | None = None) -> dict:
    """Accuracy of every provider of `wanted` running the example's classifier (`folder`, default classifier()):
    on the held-out and unseen sets (accuracy per provider; "hf-sdpa" is fp32 transformers) and top-1 agreement
    with fp32 transformers on them and on `texts` ("passages")."""
    made = {"folder": str(folder), "given": True} if folder is not None else None
    if folder is None:
        folder, made = classifier(workdir, log)
    reference, fns, skipped, desc, tok = build(folder, wanted, threads, workdir, log)
    out: dict = {"classifier": made, "head": desc, "skipped": skipped}
    sets = evaluation_sets()
    sets["passages"] = (list(texts), None, "the benchmark's accuracy passages (no labels: agreement only)")
    for part, (xs, ys, what) in sets.items():
        if not xs:
            continue
        batches = int8_accuracy.token_batches(int8_accuracy.tokenize(xs, tok, int8_accuracy.MAX_LENGTH),
                                              pad_id=tok.pad_token_id or 0)
        red = {"logits": lambda o, i: o}
        ref = int8_accuracy.collect(reference, batches, red)["logits"]
        res: dict = {"n": len(xs), "what": what}
        got = {"hf-sdpa": ref}
        for name, fn in fns.items():
            try:
                got[name] = int8_accuracy.collect(fn, batches, red)["logits"]
            except Exception as e:  # noqa: BLE001
                skipped[name] = f"{part}: {type(e).__name__}: {str(e)[:200]}"
        if ys is not None:
            y = torch.tensor(ys)
            res["accuracy"] = {n: float((g.argmax(-1) == y).double().mean()) for n, g in got.items()}
            res["agreement"] = {n: int8_accuracy.top1(ref, g)["top1_agreement"] for n, g in got.items()
                                if n != "hf-sdpa"}
            out[part] = res
        else:
            out[part] = {n: int8_accuracy.top1(ref, g) for n, g in got.items() if n != "hf-sdpa"}
    log("finetuned classifier accuracy: " + ", ".join(f"{n} {a:.1%}" for n, a in
                                                      out.get("heldout", {}).get("accuracy", {}).items()))
    return out
