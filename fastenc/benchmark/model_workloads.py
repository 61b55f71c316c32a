"""The inputs of `fastenc bench models` (fastenc.benchmark.models): padded text batches and image batches, and which
workloads a model runs (fixed, varlen, captions, long-2k, long; the batch-1 latency ones), chosen by its positions."""
from __future__ import annotations

import math

import torch

from fastenc.benchmark.ops._common import varlen_lengths

def text_batch(lengths: list[int], vocab: int, seed: int = 0) -> dict:
    """Padded (batch, longest) int64 ids (real tokens drawn from [1000, vocab)) and the 0/1 attention mask."""
    g = torch.Generator().manual_seed(seed)
    s = max(lengths)
    ids = torch.randint(1000, vocab, (len(lengths), s), generator=g)
    mask = (torch.arange(s)[None, :] < torch.tensor(lengths)[:, None]).long()
    return {"input_ids": ids * mask, "attention_mask": mask}


def image_batch(n: int, size: int = 224, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"pixel_values": torch.randn(n, 3, size, size, generator=g)}


LONG_TOKENS = 8192  # the long workload: one text of this many tokens (models that accept that many positions)
LONG_2K_TOKENS = 2048  # the long-2k workload (asked for only): one text of this many tokens
CAPTIONS = 32, 5, 77  # the captions workload: 32 texts, lengths uniform in [5, 77] (capped at the model's positions)
THROUGHPUT = ("fixed", "varlen", "captions", "long-2k", "long")  # the throughput workloads, in the order they run
ROUNDS = {"long": 5, "long-2k": 5}  # timed rounds of a throughput workload where not THROUGHPUT_ROUNDS (full mode)


def caption_lengths(n: int = CAPTIONS[0], lo: int = CAPTIONS[1], hi: int = CAPTIONS[2], seed: int = 0) -> list[int]:
    """The captions workload's lengths: n uniform in [lo, hi], torch.Generator().manual_seed(seed)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi + 1, (n,), generator=g).tolist()


def workloads(spec, vocab: int, positions: int | None = None, image_size: int = 224,
              only: list[str] | None = None, quick: bool = False,
              not_run: dict | None = None) -> dict[str, tuple[dict, int, str]]:
    """name -> (inputs, useful units (tokens or images), description) of what `spec` (a models.ModelSpec) runs.

    Vision: fixed (8 images) and batch-1 latency (1 image), at the model's image_size. Text: the batch-1 latency
    workloads (1 x 16 tokens; 1 x 128, or 1 x positions for a model with fewer), and those of the throughput
    workloads asked for in `only` (None: the defaults) that fit the model's `positions` (None: any length):
      fixed     8 x 128 tokens                                   default where it fits
      varlen    16 texts, lengths U[16, 384] (seed 0)            default where it fits
      captions  32 texts, lengths U[5, 77] (seed 0; at most positions)   default for models of < 128 positions
      long-2k   one LONG_2K_TOKENS-token text                    asked for only, where it fits
      long      one LONG_TOKENS-token text                       default (not with quick) where it fits
    A workload asked for (or a default) that does not fit goes to `not_run` (workload -> why)."""
    not_run = {} if not_run is None else not_run
    if spec.kind == "vision":
        s = image_size
        out = {"latency": (image_batch(1, s, seed=1), 1, "1 image")}
        if only is None or "fixed" in only:
            out["fixed"] = (image_batch(8, s), 8, f"8 images {s}x{s}")
        not_run.update({w: "a text workload" for w in only or () if w in THROUGHPUT and w != "fixed"})
        return out
    cap = positions if positions else math.inf
    lat = int(min(128, cap))
    out = {"latency": (text_batch([lat], vocab, seed=1), lat, f"1 x {lat} tokens"),
           "latency-1x16": (text_batch([16], vocab, seed=2), 16, "1 x 16 tokens")}
    lens = varlen_lengths()
    hi = int(min(CAPTIONS[2], cap))
    caps = caption_lengths(hi=hi)
    cand = {"fixed": (lambda: (text_batch([128] * 8, vocab), 8 * 128, "8 x 128 tokens"), 128),
            "varlen": (lambda: (text_batch(lens, vocab), sum(lens), f"16 seqs, lengths U[16,384] seed 0 "
                                f"(sum {sum(lens)}, longest {max(lens)})"), max(lens)),
            "captions": (lambda: (text_batch(caps, vocab, seed=5), sum(caps),
                                  f"{len(caps)} captions, lengths U[{CAPTIONS[1]},{hi}] seed 0 (sum {sum(caps)}, "
                                  f"longest {max(caps)})"), max(caps)),
            "long-2k": (lambda: (text_batch([LONG_2K_TOKENS], vocab, seed=3), LONG_2K_TOKENS,
                                 f"1 x {LONG_2K_TOKENS} tokens"), LONG_2K_TOKENS),
            "long": (lambda: (text_batch([LONG_TOKENS], vocab, seed=4), LONG_TOKENS, f"1 x {LONG_TOKENS} tokens"),
                     LONG_TOKENS)}
    if only is None:
        want = {"fixed", "varlen"} | ({"captions"} if cap < 128 else set())
        want |= {"long"} if cap >= LONG_TOKENS and not quick else set()
    else:
        want = set(only)
    for w, (make, longest) in cand.items():
        if w not in want:
            continue
        if longest > cap:
            not_run[w] = f"its longest text ({longest} tokens) exceeds the model's {positions} positions"
            continue
        out[w] = make()
    return out


LATENCY = ("latency-1x16", "latency")  # the batch-1 workloads, timed first (they warm every provider up)
