"""The int8 peers fastenc's int8 inference is benchmarked against (ONNX Runtime fp32 and dynamic int8, torch dynamic
int8, CTranslate2, OpenVINO with nncf int8 weights), each built from a transformers model into fn(inputs) -> last
hidden state, plus the accuracy helpers the report compares them with.

build(name, hf_model, kind, threads, workdir) -> fn({"input_ids", "attention_mask"} or {"pixel_values"}) -> (batch,
seq, hidden) fp32; fn.info holds what the build found (seconds, ORT fused operators, ...). Every file a build writes
lies under `workdir`. A peer that cannot run here raises PeerUnavailable(reason).
"""
from __future__ import annotations

import contextlib
import copy
import importlib.metadata
import io
import json
import logging
import time
import warnings
from pathlib import Path
from typing import Callable

import torch


class PeerUnavailable(Exception):
    """Why a peer cannot run here (package missing, architecture unsupported, output check failed, ...)."""


PEERS = ("onnxruntime-fp32", "onnxruntime-int8", "torch-dynamic-int8", "ctranslate2-int8",
         "ctranslate2-int8_float32", "openvino-int8")
KINDS = ("text", "vision")
ORT_TOL = 1e-4  # max abs difference (x max(1, |ref|max)) of the optimized fp32 ONNX model against transformers
ORT_OPSET = 17
# transformers model_type -> the converter CTranslate2 has for it (ctranslate2/converters/transformers.py loaders)
CT2_TYPES = ("bert", "distilbert", "roberta", "xlm-roberta", "camembert")
OV_COMPRESSION = "INT8_ASYM"  # nncf.compress_weights default and optimum-intel's --weight-format int8
OV_PRECISION = "f32"  # activations in fp32 like every other peer (the CPU plugin's default on AMX CPUs is bf16)

_DESCRIPTIONS = {
    "onnxruntime-fp32": "ONNX Runtime {ort} CPU: torch.onnx.export (TorchScript, opset 17, eager attention, dynamic "
                        "batch/seq) + onnxruntime.transformers optimize_model fusions, fp32; intra_op=threads, "
                        "inter_op=1, no spinning",
    "onnxruntime-int8": "ONNX Runtime {ort} CPU: the onnxruntime-fp32 optimized graph through quantize_dynamic "
                        "(QInt8 weights per channel, dynamic uint8 activations); intra_op=threads, inter_op=1, "
                        "no spinning",
    "torch-dynamic-int8": "torch {torch} torch.ao.quantization.quantize_dynamic(nn.Linear -> qint8, per tensor, "
                          "dynamic activations) of the transformers model, inference_mode, torch's own threads",
    "ctranslate2-int8": "CTranslate2 {ct2} Encoder, compute_type=int8 (int8 weights and GEMMs, fp32 elsewhere), "
                        "intra_threads=threads, unpadded token lists",
    "ctranslate2-int8_float32": "CTranslate2 {ct2} Encoder, compute_type=int8_float32 (on CPU the same kernels as "
                                "int8), intra_threads=threads, unpadded token lists",
    "openvino-int8": "OpenVINO {openvino} CPU: ov.convert_model of the transformers model + nncf {nncf} "
                     f"compress_weights({OV_COMPRESSION}, int8 weights per output channel), PERFORMANCE_HINT=LATENCY"
                     f" (one stream), INFERENCE_NUM_THREADS=threads, INFERENCE_PRECISION_HINT={OV_PRECISION}",
}


def versions() -> dict[str, str | None]:
    """Installed versions of the peers' packages (None: not installed), read without importing them."""
    dists = {"onnxruntime": ("onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino"), "ctranslate2": ("ctranslate2",),
             "openvino": ("openvino",), "nncf": ("nncf",)}
    out: dict[str, str | None] = {}
    for key, names in dists.items():
        out[key] = None
        for n in names:
            with contextlib.suppress(importlib.metadata.PackageNotFoundError):
                out[key] = importlib.metadata.version(n)
                break
    return out


def describe(name: str) -> str:
    """One line: what peer `name` is and its settings (for the results JSON)."""
    _check_name(name)
    v = versions()
    return _DESCRIPTIONS[name].format(ort=v["onnxruntime"], ct2=v["ctranslate2"], openvino=v["openvino"],
                                      nncf=v["nncf"], torch=torch.__version__)


def build(name: str, hf_model, kind: str, threads: int, workdir: Path,
          log: Callable[[str], None] = print) -> Callable[[dict], torch.Tensor]:
    """Peer `name` of `hf_model` (a transformers base model, fp32, CPU; put in eval mode): fn(inputs) -> last hidden
    state (batch, seq, hidden) fp32. inputs: kind "text": {"input_ids": (batch, seq) int64, "attention_mask": (batch,
    seq) 0/1, right padded}; kind "vision": {"pixel_values": (batch, 3, H, W)}. Values at padded positions are
    unspecified. Raises PeerUnavailable(reason) when the peer cannot run this model here, ValueError on bad
    arguments."""
    _check_name(name)
    if kind not in KINDS:
        raise ValueError(f"kind: expected one of {KINDS}, got {kind!r}")
    if not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads: expected a positive int, got {threads!r}")
    workdir = Path(workdir) / name
    workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if name.startswith("onnxruntime-"):
        fn, info = _build_ort(name, hf_model.eval(), kind, threads, workdir, log)
    elif name == "torch-dynamic-int8":
        fn, info = _build_torch(hf_model.eval(), kind)
    elif name.startswith("ctranslate2-"):
        fn, info = _build_ct2(name.split("-", 1)[1], hf_model.eval(), kind, threads, workdir)
    else:
        fn, info = _build_openvino(hf_model.eval(), kind, threads)
    fn.info = {**info, "build_s": round(time.perf_counter() - t0, 2)}
    log(f"{name}: built in {fn.info['build_s']:.1f} s")
    return fn


def mean_pooled(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(batch, seq, dim) hidden states, (batch, seq) 0/1 mask -> (batch, dim) L2-normalized mean over real tokens
    (padded positions are ignored, whatever they hold)."""
    if hidden.dim() != 3 or attention_mask.shape != hidden.shape[:2]:
        raise ValueError(f"hidden, attention_mask: expected (batch, seq, dim) and (batch, seq), got "
                         f"{tuple(hidden.shape)} and {tuple(attention_mask.shape)}")
    keep = attention_mask.bool().unsqueeze(-1)
    total = torch.where(keep, hidden.float(), 0.0).sum(1)
    return torch.nn.functional.normalize(total / keep.sum(1).clamp(min=1), dim=-1)


def cosine_agreement(ref: torch.Tensor, other: torch.Tensor) -> dict:
    """Row-wise cosine of two (N, d) tensors: {"cos_min", "cos_mean", "n"}."""
    if ref.dim() != 2 or ref.shape != other.shape:
        raise ValueError(f"ref, other: expected two (N, d) tensors of one shape, got {tuple(ref.shape)} and "
                         f"{tuple(other.shape)}")
    cos = torch.nn.functional.cosine_similarity(ref.double(), other.double(), dim=1)
    return {"cos_min": float(cos.min()), "cos_mean": float(cos.mean()), "n": int(ref.shape[0])}


def _check_name(name: str) -> None:
    if name not in PEERS:
        raise ValueError(f"name: expected one of {', '.join(PEERS)}; got {name!r}")


@contextlib.contextmanager
def _quiet(*loggers: str):
    """Silence warnings, stdout and the named loggers' records below ERROR ("": the root logger, which then gets a
    NullHandler so that a logging.warning() call cannot configure it for the whole process)."""
    saved = [(logging.getLogger(n), logging.getLogger(n).level) for n in loggers]
    null = logging.NullHandler()
    logging.getLogger().addHandler(null)
    try:
        for lg, _ in saved:
            lg.setLevel(logging.ERROR)
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in saved:
            lg.setLevel(level)
        logging.getLogger().removeHandler(null)


def _import(module: str, pip: str):
    try:
        return __import__(module)
    except ImportError as e:
        raise PeerUnavailable(f"{module} is not installed (pip install {pip}): {e}") from e


def _example(hf_model, kind: str, batch: int = 2, seq: int = 16) -> dict:
    """Inputs for export and checks: right-padded token ids (row 0 full, row 1 shorter), or random images."""
    g = torch.Generator().manual_seed(0)
    if kind == "vision":
        size = getattr(hf_model.config, "image_size", 224)
        return {"pixel_values": torch.randn(batch, getattr(hf_model.config, "num_channels", 3), size, size,
                                            generator=g)}
    vocab = hf_model.config.vocab_size
    ids = torch.randint(5, min(vocab, 1000), (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    for i in range(1, batch):
        mask[i, max(2, seq - 3 - 2 * i):] = 0
    pad = getattr(hf_model.config, "pad_token_id", None) or 0
    return {"input_ids": ids.masked_fill(mask == 0, pad), "attention_mask": mask}


class _LastHidden(torch.nn.Module):
    """hf_model's forward to its last hidden state, with positional inputs (what the exporters trace)."""

    def __init__(self, model, kind: str):
        super().__init__()
        self.model, self.kind = model, kind

    def forward(self, x, attention_mask=None):
        if self.kind == "vision":
            return self.model(pixel_values=x).last_hidden_state
        return self.model(input_ids=x, attention_mask=attention_mask).last_hidden_state


def _names(kind: str) -> list[str]:
    return ["pixel_values"] if kind == "vision" else ["input_ids", "attention_mask"]


def _max_diff(ref: torch.Tensor, out: torch.Tensor, inputs: dict) -> float:
    if "attention_mask" in inputs:
        keep = inputs["attention_mask"].bool().unsqueeze(-1)
        return float(torch.where(keep, (out - ref).abs(), 0.0).max())
    return float((out - ref).abs().max())


# ---------------------------------------------------------------- ONNX Runtime


def _build_ort(name, hf_model, kind, threads, workdir, log):
    _import("onnxruntime", "onnxruntime")  # PeerUnavailable when it is not installed
    onnx = _import("onnx", "onnx")
    from onnxruntime.transformers.optimizer import optimize_model

    cfg = hf_model.config
    heads = getattr(cfg, "num_attention_heads", None) or getattr(cfg, "n_heads", None)
    hidden = getattr(cfg, "hidden_size", None) or getattr(cfg, "dim", None)
    if not heads or not hidden:
        raise PeerUnavailable(f"{name}: config {type(cfg).__name__} names no attention heads / hidden size")
    model = copy.deepcopy(hf_model)
    try:
        model.set_attn_implementation("eager")  # the fusions match the eager MatMul/Softmax graph, not SDPA's
    except (AttributeError, ValueError) as e:
        raise PeerUnavailable(f"{name}: {type(model).__name__} has no eager attention to export: {e}") from e
    example = _example(model, kind)
    big = sum(p.numel() for p in model.parameters()) * 4 > 1.5e9  # beyond protobuf's 2 GB: external data
    raw, opt = workdir / "model.onnx", workdir / "model_opt.onnx"
    names = _names(kind)
    axes = {n: ({0: "batch"} if kind == "vision" else {0: "batch", 1: "seq"}) for n in names}
    axes["last_hidden_state"] = {0: "batch", 1: "seq"}
    log(f"{name}: torch.onnx.export (TorchScript, opset {ORT_OPSET}, eager attention) ...")
    try:
        with _quiet(), torch.no_grad():
            torch.onnx.export(_LastHidden(model, kind), tuple(example[n] for n in names), str(raw), dynamo=False,
                              opset_version=ORT_OPSET, input_names=names, output_names=["last_hidden_state"],
                              dynamic_axes=axes, do_constant_folding=True)
    except Exception as e:
        raise PeerUnavailable(f"{name}: torch.onnx.export failed for {type(model).__name__}: "
                              f"{type(e).__name__}: {str(e)[:300]}") from e
    del model
    _prepare_for_fusion(raw, big)
    model_type = "vit" if kind == "vision" else "bert"
    with _quiet("onnxruntime.transformers"):
        optimized = optimize_model(str(raw), model_type=model_type, num_heads=heads, hidden_size=hidden)
    fused = {k: v for k, v in optimized.get_fused_operator_statistics().items() if v}
    log(f"{name}: optimize_model(model_type={model_type!r}) fused {fused}")
    if not fused.get("Attention") and not fused.get("MultiHeadAttention"):
        log(f"{name}: attention is not fused for {cfg.model_type} (ORT runs its unfused MatMul/Softmax graph)")
    optimized.save_model_to_file(str(opt), use_external_data_format=big)
    raw.unlink()
    info = {"fused": fused, "optimizer_model_type": model_type}
    check = _example(hf_model, kind, batch=3, seq=11)
    fp32 = _ort_session(opt, kind, threads)
    with torch.inference_mode():
        ref = hf_model(**check).last_hidden_state.float()
    diff = _max_diff(ref, fp32(check), check)
    tol = ORT_TOL * max(1.0, float(ref.abs().max()))
    info["max_abs_diff_fp32"] = diff
    log(f"{name}: optimized fp32 ONNX vs transformers max abs diff {diff:.2e} (tolerance {tol:.1e})")
    if not diff <= tol:
        raise PeerUnavailable(f"{name}: the optimized fp32 ONNX model of {cfg.model_type} differs from transformers "
                              f"by {diff:.3g} > {tol:.1g}")
    if name == "onnxruntime-fp32":
        return fp32, info
    from onnxruntime.quantization import QuantType, quantize_dynamic

    q = workdir / "model_int8.onnx"
    with _quiet(""):  # quantize_dynamic advises pre-processing through logging.warning (the root logger)
        quantize_dynamic(str(opt), str(q), weight_type=QuantType.QInt8, per_channel=True,
                         use_external_data_format=big, extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    ops: dict[str, int] = {}
    for node in onnx.load(str(q), load_external_data=False).graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    info["int8_ops"] = {k: v for k, v in sorted(ops.items()) if k.startswith(("Q", "Dynamic", "MatMulInteger"))}
    log(f"{name}: quantize_dynamic(QInt8, per_channel) -> {info['int8_ops']}")
    return _ort_session(q, kind, threads), info


def _prepare_for_fusion(path: Path, external: bool) -> None:
    """Rewrite the exported graph into the forms onnxruntime.transformers' attention fusion matches: drop Casts to
    the type their input already has (transformers 5's eager softmax(dtype=float32).to(dtype) puts two between
    Softmax and the second MatMul), and turn an unmasked Softmax(Mul(MatMul, c)) into Softmax(Div(MatMul, 1 / c))
    (the fusion knows the mask-free Q K^T scaling as a Div only; transformers 5 multiplies)."""
    import numpy as np
    import onnx
    from onnxruntime.transformers.onnx_model import OnnxModel

    m = OnnxModel(onnx.load(str(path)))
    m.remove_useless_cast_nodes()
    producers = m.output_name_to_node()
    for i, softmax in enumerate(n for n in m.nodes() if n.op_type == "Softmax"):
        mul = producers.get(softmax.input[0])
        if mul is None or mul.op_type != "Mul":
            continue
        for a, b in ((0, 1), (1, 0)):
            scale = m.get_constant_value(mul.input[b])
            parent = producers.get(mul.input[a])
            if scale is not None and np.size(scale) == 1 and float(scale) != 0 and parent is not None \
                    and parent.op_type == "MatMul":
                name = f"{mul.name or 'qk'}_inverse_scale_{i}"
                m.add_initializer(onnx.numpy_helper.from_array(np.asarray(1.0 / scale, dtype=np.float32)
                                                               .reshape(np.shape(scale)), name))
                mul.op_type = "Div"
                mul.input[:] = [mul.input[a], name]
                break
    m.prune_graph()
    m.save_model_to_file(str(path), use_external_data_format=external)


def _ort_session(path: Path, kind: str, threads: int):
    from fastenc.benchmark.onnx_export import cpu_session

    sess = cpu_session(path, threads)
    names = _names(kind)

    def run(inputs: dict) -> torch.Tensor:
        return torch.from_numpy(sess.run(None, {n: inputs[n].numpy() for n in names})[0])
    return run


# ---------------------------------------------------------------- torch dynamic int8


def _build_torch(hf_model, kind):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qmodel = torch.ao.quantization.quantize_dynamic(copy.deepcopy(hf_model), {torch.nn.Linear},
                                                        dtype=torch.qint8)
    names = _names(kind)

    def run(inputs: dict) -> torch.Tensor:
        with torch.inference_mode():
            return qmodel(**{n: inputs[n] for n in names}).last_hidden_state
    n_q = sum(type(m).__name__ == "Linear" and "quantized" in type(m).__module__ for m in qmodel.modules())
    return run, {"quantized_linears": n_q, "engine": torch.backends.quantized.engine}


# ---------------------------------------------------------------- CTranslate2


class _Vocabulary:
    """Stands in for a tokenizer in CTranslate2's converter: token i is "<i>" (the peer feeds ids, not strings)."""

    def __init__(self, size: int):
        self.size, self.unk_token = size, "<0>"

    def get_vocab(self) -> dict:
        return {f"<{i}>": i for i in range(self.size)}


def _build_ct2(compute_type, hf_model, kind, threads, workdir):
    name = f"ctranslate2-{compute_type}"
    model_type = hf_model.config.model_type
    if kind != "text" or model_type not in CT2_TYPES:
        raise PeerUnavailable(f"{name}: CTranslate2 has no encoder converter for {model_type} ({kind}); it converts "
                              f"{', '.join(CT2_TYPES)}")
    pe = getattr(hf_model.config, "position_embedding_type", "absolute")
    if pe != "absolute":
        raise PeerUnavailable(f"{name}: CTranslate2 supports absolute position embeddings only, not {pe!r}")
    ct2 = _import("ctranslate2", "ctranslate2")
    import numpy as np
    from ctranslate2.converters import TransformersConverter

    src, out = workdir / "hf", workdir / "ct2"
    hf_model.save_pretrained(src)
    cfg_path = src / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.setdefault("position_embedding_type", "absolute")  # transformers 5 dropped it; CT2's loaders assert on it
    cfg_path.write_text(json.dumps(cfg, indent=2))
    vocab = _Vocabulary(hf_model.config.vocab_size)

    class Converter(TransformersConverter):
        def load_tokenizer(self, tokenizer_class, model_name_or_path, **kwargs):
            return vocab

    try:
        with _quiet():
            Converter(str(src)).convert(str(out), force=True)
    except Exception as e:
        raise PeerUnavailable(f"{name}: CTranslate2 could not convert {model_type}: {type(e).__name__}: "
                              f"{str(e)[:300]}") from e
    encoder = ct2.Encoder(str(out), device="cpu", compute_type=compute_type, intra_threads=threads, inter_threads=1)

    def run(inputs: dict) -> torch.Tensor:
        ids, mask = inputs["input_ids"], inputs["attention_mask"].bool()
        rows = [ids[i][mask[i]].tolist() for i in range(ids.shape[0])]
        hidden = torch.from_numpy(np.asarray(encoder.forward_batch(rows).last_hidden_state))
        full = hidden.new_zeros(ids.shape[0], ids.shape[1], hidden.shape[-1])
        full[:, :hidden.shape[1]] = hidden
        return full
    return run, {"compute_type": compute_type, "converted_to": str(out)}


# ---------------------------------------------------------------- OpenVINO


def _build_openvino(hf_model, kind, threads):
    ov = _import("openvino", "openvino")
    nncf = _import("nncf", "nncf")
    example = _example(hf_model, kind)
    names = _names(kind)
    model, attention = hf_model, hf_model.config._attn_implementation
    if getattr(hf_model.config, "local_attention", None) or getattr(hf_model.config, "sliding_window", None):
        # converted SDPA turns a padded query whose window holds only padding into NaN, which then spreads to
        # real tokens through the next layer's P @ V; the eager graph's finite mask does not
        model, attention = copy.deepcopy(hf_model), "eager"
        model.set_attn_implementation("eager")
    try:
        with _quiet("transformers"), torch.no_grad():
            ov_model = ov.convert_model(_LastHidden(model, kind), example_input=tuple(example[n] for n in names))
    except Exception as e:
        raise PeerUnavailable(f"openvino-int8: ov.convert_model failed for {hf_model.config.model_type}: "
                              f"{type(e).__name__}: {str(e)[:300]}") from e
    with _quiet("nncf"):
        ov_model = nncf.compress_weights(ov_model, mode=getattr(nncf.CompressWeightsMode, OV_COMPRESSION))
    config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": OV_PRECISION}
    compiled = ov.Core().compile_model(ov_model, "CPU", config)
    request = compiled.create_infer_request()

    def run(inputs: dict) -> torch.Tensor:
        request.infer([inputs[n].numpy() for n in names])
        return torch.from_numpy(request.get_output_tensor(0).data.copy())
    return run, {"compression": OV_COMPRESSION, "config": config, "attention": attention}
