"""`fastenc bench train`: training-step throughput (forward + cross-entropy + backward + AdamW step) of fastenc
against transformers sdpa (and torch.compile of it) for full fine-tuning, and against transformers + PEFT for
LoRA (r 8, alpha 16, dropout 0.1 on query/value, Wqkv for ModernBERT, q_proj/v_proj for ViT; the head trained
as PEFT's SEQ_CLS modules_to_save; each architecture's own targets from the architecture table), by default on
BERT-base, ModernBERT-base and ViT-B/16 classifiers (--models: any base model of fastenc.benchmark.models whose
architecture has a classifier head) built from their configs with random weights (seed 0).

Workloads (as `fastenc bench models`): fixed 8 x 128 tokens (ViT: 8 images) and the variable-length batch
(16 sequences, lengths uniform in [16, 384], seed 0) padded to its longest with a mask for every provider
(fastenc unpads inside). Throughput counts useful (non-pad) tokens. Every provider starts from the same weights
and labels, all in train mode with the configs' dropout: by default every dropout of the model's config as
transformers defines it (BERT-base: 0.1 on the attention probabilities too; ModernBERT's and ViT's default configs
have 0 there), the step a user of either library trains; `--attention-dropout off` sets the attention-probability
dropout to 0 for every provider (the hidden/MLP dropouts stay), which compares the attention kernels without their
dropout cost (rows and JSON record the p used as attention_dropout_p); the steps of the providers are
interleaved (ABAB) and the paired ratio is the median of the per-round ratios. Peak memory: the resident-set growth during one
training step after the warm-up steps (optimizer state already allocated), sampled every millisecond
(fastenc.benchmark.timing.peak_memory). Before timing, each provider's eval-mode logits are checked against
transformers' (max abs error recorded).

Optimizer (the same for every provider): by default torch.optim.AdamW(fused=True), the one transformers' Trainer
builds by default (`optim="adamw_torch_fused"`); `--optimizer adamw_torch` takes torch.optim.AdamW with its
default implementation instead (on CPU a loop of elementwise passes per parameter: 4-6x the fused step's time,
bench/results/train/adamw_step-e59aa02.txt), the setting of the results before the option.

Several models run one fresh process each (fastenc.benchmark.isolated; `--same-process` keeps one), as in
`fastenc bench models`: a model measured after a larger one in the same process starts from the heap that one left
(glibc's mmap and trim thresholds raised), which moved both the step times and the memory figures.

--breakdown: after timing, one step of fastenc and of the full-mode baseline (or LoRA's) under torch.profiler
(fastenc.benchmark.latency.breakdown): its time in GEMMs, fastenc's ops, other ops and the rest, the GEMMs' shapes
and FLOPs, and those GEMMs timed alone (latency.gemm_alone, the best of torch's plain and prepacked paths and
fastenc's panels). Each fastenc row then gets `gemm_floor_ms` (its step's GEMMs alone, or inside the profiled
step where that was less (latency.gemm_floor): the step's time if nothing else took any) and
`ceiling_ratio_vs_<baseline>` = the baseline's median step / that floor: the highest paired ratio an implementation
running fastenc's GEMMs at this machine's rate could reach. A target above it needs fewer
FLOPs or a faster GEMM, not less overhead.
"""
from __future__ import annotations

import copy
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from fastenc.benchmark import isolated, latency, options, report, timing
from fastenc.benchmark.ops._common import varlen_lengths
from fastenc.benchmark.options import UsageError
from fastenc.benchmark import models as bench_models
from fastenc.benchmark.models import image_batch, paired_ratio, text_batch
from fastenc.models import architecture

# The classifier task each modality trains (a head every architecture of the table declares for its modality).
TASKS = {"text": "sequence_classification", "vision": "image_classification"}
# Every random-weight base model of the model benchmarks whose architecture has that head; the default selection.
MODELS = tuple(n for n, s in bench_models.MODELS.items()
               if s.model_type and TASKS[s.kind] in architecture.get(s.model_type).heads)
DEFAULT_MODELS = ("bert-base", "modernbert-base", "vit-b16")
BASELINE = {"full": "hf-sdpa", "lora": "hf-sdpa+peft"}
WORKLOADS = ("fixed", "varlen")
LR = 1e-4
# --optimizer: transformers' TrainingArguments.optim names -> the keyword arguments of torch.optim.AdamW.
OPTIMIZERS = {"adamw_torch_fused": {"fused": True}, "adamw_torch": {}}
# The config keys transformers names the attention-probability dropout by (the first one a config has).
ATTENTION_DROPOUT = ("attention_probs_dropout_prob", "attention_dropout")
# Quick mode's small vocabulary and the special-token ids moved into it (where the default lies outside).
QUICK_VOCAB = 1100  # (text_batch draws ids from [1000, vocab))
QUICK_IDS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "cls_token_id": 1, "sep_token_id": 2}


COMMAND = "train"
HELP = "training steps (full and LoRA) vs transformers (+ PEFT for LoRA)"


def add_arguments(p) -> None:
    options.models(p, f"comma-separated of {', '.join(MODELS)} (default: {', '.join(DEFAULT_MODELS)})")
    p.add_argument("--modes", default=None, help="comma-separated of full, lora (default: both)")
    options.providers(p, "comma-separated providers to keep: fastenc,hf-sdpa,hf-sdpa+peft,hf-compile")
    p.add_argument("--attention-dropout", default="config", help="'config' (the models' own attention-probability "
                   "dropout, BERT 0.1; default) or 'off' (0 for every provider)")
    p.add_argument("--optimizer", default="adamw_torch_fused",
                   help="the AdamW every provider steps with, by transformers' name: adamw_torch_fused "
                        "(torch.optim.AdamW(fused=True), the Trainer's default; default) or adamw_torch")
    options.workloads(p, "comma-separated of fixed, varlen (default: both; ViT has fixed only)")
    options.breakdown(p, "one step of fastenc and the baseline under torch.profiler, with fastenc's GEMM floor and "
                      "the ceiling ratio")
    options.same_process(p)
    options.no_compile(p)
    options.no_plots(p)


def command(args, device: str, dtype: torch.dtype, out: Path) -> dict:
    return bench_train(quick=args.quick, out=out, models=options.split(args.models), modes=options.split(args.modes),
                       providers=options.split(args.providers), compile_hf=not args.no_compile,
                       plots=not args.no_plots, note=args.note, repeats=args.repeats,
                       attention_dropout=args.attention_dropout, workloads=options.split(args.workloads),
                       optimizer=args.optimizer, breakdown=args.breakdown,
                       isolate=False if args.same_process else None)


def architecture_of(name: str):
    """The Architecture of a train benchmark model name."""
    if name not in MODELS:
        raise UsageError(f"--models: unknown {name!r}; known: {list(MODELS)}")
    return architecture.get(bench_models.MODELS[name].model_type)


def attention_dropout_key(config) -> str:
    return next(k for k in ATTENTION_DROPOUT if hasattr(config, k))


def build_hf(name: str, quick: bool, attention_dropout: str = "config"):
    """The transformers classifier for a benchmark model name (quick: a tiny config of the same family), with the
    config's attention-probability dropout ("config") or none ("off")."""
    arch = architecture_of(name)
    task = TASKS[arch.modality]
    defaults = bench_models.hf_class(arch, task).config_class()
    torch.manual_seed(0)
    small = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128) if quick else {}
    if quick and arch.modality == "vision":
        small["image_size"] = 32
    elif quick:
        small["vocab_size"] = QUICK_VOCAB
        small.update({k: v for k, v in QUICK_IDS.items() if (getattr(defaults, k, None) or 0) >= QUICK_VOCAB})
    if attention_dropout == "off":
        small[attention_dropout_key(defaults)] = 0.0
    cfg = bench_models.hf_config(arch, task, num_labels=10 if arch.modality == "vision" else 2, **small)
    model = bench_models.hf_class(arch, task)(cfg)
    model.set_attn_implementation("sdpa")
    return model


def train_workloads(name: str, hf, quick: bool) -> dict[str, tuple[dict, torch.Tensor, int, str]]:
    """workload -> (inputs, labels, useful units, description)."""
    g = torch.Generator().manual_seed(1)
    if architecture_of(name).modality == "vision":
        n, size = (2, 32) if quick else (8, 224)
        return {"fixed": (image_batch(n, size), torch.randint(0, 10, (n,), generator=g), n, f"{n} images {size}px")}
    vocab = hf.config.vocab_size
    fixed = [32] * 2 if quick else [128] * 8
    lens = varlen_lengths(n=4, hi=64) if quick else varlen_lengths()
    return {"fixed": (text_batch(fixed, vocab), torch.randint(0, 2, (len(fixed),), generator=g), sum(fixed),
                      f"{len(fixed)} x {fixed[0]} tokens"),
            "varlen": (text_batch(lens, vocab), torch.randint(0, 2, (len(lens),), generator=g), sum(lens),
                       f"{len(lens)} seqs, lengths U[16,{max(lens) if quick else 384}] seed 0 (sum {sum(lens)}, "
                       f"longest {max(lens)})")}


def _logits(model, inputs: dict, fastenc_model: bool) -> torch.Tensor:
    if fastenc_model:
        if "pixel_values" in inputs:
            return model(inputs["pixel_values"])
        return model(inputs["input_ids"], inputs["attention_mask"])
    return model(**inputs).logits


def build_providers(name: str, hf, mode: str, providers: list[str], log: Callable[[str], None]
                    ) -> tuple[dict[str, tuple[torch.nn.Module, bool]], dict[str, str]]:
    """provider -> (model in train mode, is fastenc's), and provider -> reason skipped."""
    import fastenc

    arch = architecture_of(name)
    targets, vision = list(arch.lora_targets), arch.modality == "vision"
    out, skipped = {}, {}
    for p in providers:
        try:
            if p == "fastenc":
                m = fastenc.from_hf(copy.deepcopy(hf))
                if mode == "lora":
                    m.add_lora(r=8, lora_alpha=16, target_modules=targets, lora_dropout=0.1,
                               modules_to_save=["classifier"] if vision else None)
                out[p] = (m.train(), True)
            elif p in ("hf-sdpa", "hf-sdpa+peft", "hf-compile"):
                m = copy.deepcopy(hf)
                if mode == "lora":
                    from peft import LoraConfig, get_peft_model
                    task = None if vision else "SEQ_CLS"
                    m = get_peft_model(m, LoraConfig(task_type=task, r=8, lora_alpha=16, lora_dropout=0.1,
                                                     target_modules=targets,
                                                     modules_to_save=["classifier"] if vision else None))
                if p == "hf-compile":
                    log(f"{name} {mode}: torch.compile of transformers compiles at its first steps ...")
                    m = torch.compile(m)
                out[p] = (m.train(), False)
            else:
                skipped[p] = f"unknown provider {p!r}"
        except Exception as e:  # a baseline that cannot be built is a skip; fastenc's own failure is raised
            if p == "fastenc":
                raise
            skipped[p] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    return out, skipped


def _check(models: dict, inputs: dict, ref_name: str) -> dict[str, float]:
    """Max abs difference of every provider's eval-mode logits from the baseline's."""
    with torch.no_grad():
        outs = {}
        for p, (m, own) in models.items():
            m.eval()
            outs[p] = _logits(m, inputs, own).float()
            m.train()
    ref = outs.get(ref_name)
    return {p: (float((o - ref).abs().max()) if ref is not None else float("nan")) for p, o in outs.items()}


def _stepper(model: torch.nn.Module, own: bool, inputs: dict, labels: torch.Tensor,
             optimizer: str = "adamw_torch_fused") -> Callable[[], float]:
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR, **OPTIMIZERS[optimizer])

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(_logits(model, inputs, own), labels)
        loss.backward()
        opt.step()
        return float(loss.detach())
    return step


def _write(out: Path, meta: dict, providers: list[str], results: list[dict], complete: bool
           ) -> tuple[dict, list[Path]]:
    """train.json + train.csv with every finished workload (rewritten after each one: a long run that is stopped
    keeps what it measured; "complete" says whether the run ended)."""
    rows = [r for res in results for r in res["rows"]]
    payload = {"suite": "train", **meta, "complete": complete, "providers": providers, "cases": results,
               "rows": rows}
    return payload, [report.write_json(out / "train.json", payload), report.write_csv(out / "train.csv", rows)]


def run_case(name: str, mode: str, providers: list[str], *, quick: bool, repeats: int, log: Callable[[str], None],
             tick: Callable[[], None] | None = None, out: Path | None = None, meta: dict | None = None,
             results: list[dict] | None = None,
             attention_dropout: str = "config", workloads: list[str] | None = None,
             optimizer: str = "adamw_torch_fused", breakdown: bool = False) -> dict:
    """One model x mode: rows per provider x workload (those in `workloads`, default all) with throughput, ratios
    to the baseline, peak memory (the files in `out`, when given, rewritten after each workload, with the finished
    `results` before this case); breakdown: each row of fastenc and the baseline gets its step's `breakdown` and fastenc's
    its GEMM floor and ceiling ratio (module docstring)."""
    hf = build_hf(name, quick, attention_dropout)
    p_attn = getattr(hf.config, attention_dropout_key(hf.config))
    wanted = [p for p in providers if (mode == "lora") == p.endswith("+peft") or p == "fastenc"]
    models, skipped = build_providers(name, hf, mode, wanted, log)
    loads = {w: v for w, v in train_workloads(name, hf, quick).items() if workloads is None or w in workloads}
    base = BASELINE[mode]
    errors = _check(models, next(iter(loads.values()))[0], base) if loads else {}
    rows = []
    for w, (inputs, labels, units, desc) in loads.items():
        steps = {p: _stepper(m, own, inputs, labels, optimizer) for p, (m, own) in models.items()}
        for p, s in steps.items():  # warm-up (and compilation) outside the timing
            s()
        mem = {p: timing.peak_memory(s)[0] for p, s in steps.items()}
        samples = timing.interleaved(steps, "cpu", warmup=0, repeats=repeats, on_round=tick)
        thr = {p: units / (timing.summarize(s).median_ms / 1e3) for p, s in samples.items()}
        for p, s in samples.items():
            st = timing.summarize(s)
            row = {"model": name, "mode": mode, "workload": w, "workload_desc": desc, "provider": p, **st.as_dict(),
                   "throughput": thr[p], "unit": "images/s" if architecture_of(name).modality == "vision" else "tokens/s",
                   "useful_units": units, "peak_mem_mib": mem[p], "max_abs_err_logits": errors.get(p),
                   "attention_dropout_p": p_attn}
            for b in (base, "hf-compile"):
                if b in samples and b != p:
                    rows_ratio = [bt / t for bt, t in zip(samples[b], s)]
                    row[f"ratio_vs_{b}"] = thr[p] / thr[b]
                    row[f"paired_ratio_vs_{b}"] = paired_ratio(samples[b], s)
                    row[f"paired_ratio_vs_{b}_min"] = min(rows_ratio)
                    row[f"paired_ratio_vs_{b}_max"] = max(rows_ratio)
                    row[f"mem_ratio_vs_{b}"] = mem[p] / mem[b] if mem[b] > 0 else None
            rows.append(row)
        if breakdown:
            _add_breakdowns(rows[-len(samples):], steps, base, quick, log)
        case = {"model": name, "mode": mode, "rows": rows, "skipped": skipped, "errors": errors}
        if out is not None:
            _write(out, meta, providers, (results or []) + [case], complete=False)
    return case


def _add_breakdowns(rows: list[dict], steps: dict, base: str, quick: bool, log: Callable[[str], None]) -> None:
    """Profile one step of fastenc and of `base` (latency.breakdown), time their GEMMs alone, and add both to
    their rows; fastenc's row gets gemm_floor_ms and ceiling_ratio_vs_<base>."""
    by = {r["provider"]: r for r in rows}
    cache: dict = {}
    for p in ("fastenc", base):
        if p not in steps or p not in by:
            continue
        b = latency.breakdown(steps[p], calls=1)
        b.update(latency.gemm_alone(b["gemm_shapes"], rounds=3 if quick else 5, cache=cache))
        by[p]["breakdown"] = b
        log(latency.format_breakdown(by[p]["model"], by[p]["workload"], p, b, by[p]["median_ms"]))
    own = by.get("fastenc", {}).get("breakdown")
    if own is None:
        return
    floor = latency.gemm_floor(own)
    by["fastenc"]["gemm_floor_ms"] = floor
    if base in by and floor > 0:
        by["fastenc"][f"ceiling_ratio_vs_{base}"] = by[base]["median_ms"] / floor
        log(f"  {by['fastenc']['model']} {by['fastenc']['workload']}: fastenc's GEMMs alone {floor:.0f} ms, "
            f"{base}'s step {by[base]['median_ms']:.0f} ms: ceiling ratio {by[base]['median_ms'] / floor:.2f}")


def bench_train(*, quick: bool, out: Path, models=None, modes=None, providers=None, compile_hf: bool = True,
                plots: bool = True, note: str | None = None, repeats: int | None = None,
                attention_dropout: str = "config", workloads: list[str] | None = None,
                optimizer: str = "adamw_torch_fused", breakdown: bool = False, isolate: bool | None = None) -> dict:
    """Every model x mode; repeats: timed rounds per workload (default 2 with quick, else 3: a BERT-base step
    takes seconds to tens of seconds on a few CPU cores); attention_dropout: "config" (the models' own) or
    "off" (0 for every provider); workloads: of "fixed", "varlen" (default both; ViT-B/16 has only fixed);
    optimizer: a key of OPTIMIZERS (transformers' name for it), the same for every provider; breakdown: profile
    a step of fastenc and the baseline per workload (module docstring); isolate: each model in a fresh process
    (fastenc.benchmark.isolated; default when more than one model runs), as `fastenc bench models` does."""
    from tqdm import tqdm

    names = models or (["bert-base"] if quick else list(DEFAULT_MODELS))
    bad = [n for n in names if n not in MODELS]
    if bad:
        raise UsageError(f"--models: unknown {bad}; known: {list(MODELS)}")
    modes = modes or ["full", "lora"]
    if [m for m in modes if m not in BASELINE]:
        raise UsageError(f"--modes: must be among {list(BASELINE)}, got {modes}")
    bad = sorted(set(workloads or ()) - set(WORKLOADS))
    if bad:
        raise UsageError(f"--workloads: unknown {bad}; known for train: fixed, varlen")
    if attention_dropout not in ("config", "off"):
        raise UsageError(f"--attention-dropout: must be 'config' or 'off', got {attention_dropout!r}")
    if optimizer not in OPTIMIZERS:
        raise UsageError(f"--optimizer: must be one of {list(OPTIMIZERS)}, got {optimizer!r}")
    providers = providers or (["fastenc", "hf-sdpa", "hf-sdpa+peft"] + (["hf-compile"] if compile_hf and not quick
                                                                          else []))

    def log(msg):
        tqdm.write(msg, file=sys.stderr)

    repeats = repeats or (2 if quick else 3)
    if repeats < 1:
        raise UsageError(f"--repeats must be >= 1, got {repeats}")
    meta = report.metadata("cpu", torch.float32, quick)
    meta.update(note=note, repeats=repeats, threads=torch.get_num_threads(), lr=LR,
                optimizer=optimizer, optimizer_kwargs=OPTIMIZERS[optimizer],
                memory="RSS growth during one training step after warm-up, sampled every 1 ms",
                lora=dict(r=8, lora_alpha=16, lora_dropout=0.1,
                          targets={architecture_of(n).model_type: list(architecture_of(n).lora_targets) for n in names}), attention_dropout=attention_dropout,
                workloads=workloads or list(WORKLOADS), breakdown=breakdown)
    isolate = len(names) > 1 if isolate is None else isolate
    meta["process_per_model"] = isolate
    failures: list[str] = []
    meta["failures"] = failures
    t0 = time.perf_counter()
    results: list[dict] = []
    out.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=len(names) * len(modes), desc="train", unit="case", file=sys.stderr, dynamic_ncols=True)
    for n in names:
        if isolate:
            bar.set_postfix_str(f"{n} {', '.join(modes)} (own process)")
            spec = {"entry": "fastenc.benchmark.train:run_isolated", "model": n, "modes": modes, "providers": providers, "quick": quick,
                    "repeats": repeats, "threads": torch.get_num_threads(), "attention_dropout": attention_dropout,
                    "workloads": workloads, "optimizer": optimizer, "breakdown": breakdown}
            for res in _run_own_process(spec, log, bar.refresh, failures):
                results.append(res)
                bar.update(1)
            _write(out, meta, providers, results, complete=False)
            continue
        for mode in modes:
            bar.set_postfix_str(f"{n} {mode}")
            res = run_case(n, mode, providers, quick=quick, repeats=repeats, log=log, tick=bar.refresh, out=out,
                           meta=meta, results=results, attention_dropout=attention_dropout, workloads=workloads,
                           optimizer=optimizer, breakdown=breakdown)
            results.append(res)
            bar.update(1)
    bar.close()
    rows = [r for res in results for r in res["rows"]]
    meta["elapsed_s"] = time.perf_counter() - t0
    payload, files = _write(out, meta, providers, results, complete=True)
    if plots:
        groups = list(dict.fromkeys(f"{r['model']} {r['mode']}\n{r['workload']}" for r in rows))
        ref = {f"{r['model']} {r['mode']}\n{r['workload']}": r["throughput"] for r in rows
               if r["provider"] == BASELINE[r["mode"]]}
        vals = {(f"{r['model']} {r['mode']}\n{r['workload']}", r["provider"]):
                r["throughput"] / ref.get(f"{r['model']} {r['mode']}\n{r['workload']}", float("nan")) for r in rows}
        files.append(report.plot_bars(out / "train_throughput.png", groups, list(dict.fromkeys(
            r["provider"] for r in rows)), vals, "training throughput relative to the transformers baseline",
            f"training step (fwd+bwd+AdamW), {meta['machine']['cpu']}, {meta['threads']} threads, fp32"))
    print(train_table(rows))
    report.print_failures(failures)
    return {"payload": payload, "files": [f for f in files if f], "failures": failures}


def _run_own_process(spec: dict, log: Callable[[str], None], tick: Callable[[], None],
                     failures: list[str]) -> list[dict]:
    """One model's cases in a fresh process (run_isolated). A process the system kills (out of memory, most often:
    torch.compile of transformers holds the most) does not end the run: it is recorded in `failures` and, when
    hf-compile was among the providers, the model runs again without it; any other failure raises."""
    try:
        return isolated.run(spec, log, tick, lambda msg: None)
    except isolated.ChildFailed as e:
        if not e.killed:
            raise
        if "hf-compile" not in spec["providers"]:
            failures.append(str(e))
            log(f"{e}; going on with the next model")
            return []
        failures.append(f"{e}; its cases ran again without hf-compile")
        log(f"{e}; running {spec['model']} again without hf-compile")
        again = {**spec, "providers": [p for p in spec["providers"] if p != "hf-compile"]}
        try:
            return isolated.run(again, log, tick, lambda msg: None)
        except isolated.ChildFailed as e2:
            if not e2.killed:
                raise
            failures.append(f"{e2} (without hf-compile)")
            return []


def run_isolated(spec: dict, send: Callable[..., None]) -> list[dict]:
    """run_case for each of the spec's modes, in a process of its own (fastenc.benchmark.isolated)."""
    return [run_case(spec["model"], mode, spec["providers"], quick=spec["quick"], repeats=spec["repeats"],
                     log=lambda m: send("log", m), tick=lambda: send("tick"),
                     attention_dropout=spec["attention_dropout"], workloads=spec["workloads"],
                     optimizer=spec["optimizer"], breakdown=spec["breakdown"])
            for mode in spec["modes"]]


def train_table(rows: list[dict]) -> str:
    cols = [("model", "model"), ("mode", "mode"), ("workload", "workload"), ("provider", "provider"),
            ("throughput", "units/s"), ("median_ms", "median ms"), ("peak_mem_mib", "peak MiB"),
            ("max_abs_err_logits", "max err")]
    for b in ("hf-sdpa", "hf-sdpa+peft", "hf-compile"):
        if any(f"paired_ratio_vs_{b}" in r for r in rows):
            cols += [(f"paired_ratio_vs_{b}", f"paired x {b}"), (f"mem_ratio_vs_{b}", f"mem / {b}")]
        if any(f"ceiling_ratio_vs_{b}" in r for r in rows):
            cols += [(f"ceiling_ratio_vs_{b}", f"ceiling x {b}")]
    return report.table(rows, cols)
