"""The original configs of GTE and NomicBERT checkpoints on the Hugging Face hub, translated to transformers' own
`gte` / `nomic_bert` config dicts, so fastenc.from_pretrained loads those folders as they are published.

- Alibaba's GTE (gte-base-en-v1.5, gte-large-en-v1.5, gte-multilingual-base: model_type "new", architectures
  ["NewModel"] and remote code): the transformers names are already used; rope_theta + rope_scaling become
  rope_parameters. Its {"type": "ntk", "factor": s} is a fixed NTK scaling applied at every length (the remote code
  builds its table for max_position_embeddings * s at load; text-embeddings-inference's gte.rs and vLLM's
  NTKScalingRotaryEmbedding compute the same): inv_freq_i = (theta * s)^(-2i/d) / s^(2/d), d the head dim, which is
  transformers' "linear" RoPE with theta' = theta * s and factor s^(2/d). pack_qkv, unpad_inputs and
  use_memory_efficient_attention choose how it runs, not what it computes.
- Nomic's NomicBERT (nomic-embed-text-v1 / v1.5: model_type "nomic_bert" with GPT-2 names): n_embd, n_head,
  n_layer, n_inner, n_positions, layer_norm_epsilon, rotary_emb_base, resid_pdrop, attn_pdrop; activation_function
  "swiglu" is transformers' gated MLP with hidden_act "silu" (fc11 the up projection, fc12 the gate:
  fc2(fc11(x) * silu(fc12(x))), as transformers' conversion mapping names them).

The weights of both keep their original names (embeddings.*, encoder.layer.N.attention.qkv_proj, attn_ln,
mlp.up_gate_proj, mlp_ln; emb_ln, encoder.layers.N.attn.Wqkv, attn.out_proj, mlp.fc11/fc12/fc2, norm1, norm2): the
gte and nomic_bert architectures read those layouts (their legacy_names / legacy_fused). A setting whose math
differs from what those models compute (RMSNorm, absolute positions, log-n attention scaling, interleaved or
partial rotary, biases NomicBERT's blocks lack, pre-norm blocks, ...) is refused, naming the config key."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

# the original GTE class names -> transformers' (the same heads: pooler + classifier, token classifier, MLM head)
GTE_CLASSES = {"NewModel": "GteModel", "NewForMaskedLM": "GteForMaskedLM",
               "NewForSequenceClassification": "GteForSequenceClassification",
               "NewForTokenClassification": "GteForTokenClassification"}
NOMIC_CLASSES = {"NomicBertModel": "NomicBertModel"}

# keys copied as they are (the same name and meaning in the original and in transformers' config)
_COMMON = ("vocab_size", "type_vocab_size", "pad_token_id", "initializer_range", "classifier_dropout", "id2label",
           "label2id", "num_labels", "problem_type", "bos_token_id", "eos_token_id", "tie_word_embeddings",
           "_name_or_path", "torch_dtype", "dtype", "transformers_version")
_GTE_SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
              "max_position_embeddings", "type_vocab_size", "layer_norm_eps", "rope_theta")
_GTE_COPY = _GTE_SIZES + ("hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob")
# NomicBERT's GPT-2 name -> transformers' name
_NOMIC_NAMES = {"n_embd": "hidden_size", "n_head": "num_attention_heads", "n_layer": "num_hidden_layers",
                "n_inner": "intermediate_size", "n_positions": "max_position_embeddings",
                "layer_norm_epsilon": "layer_norm_eps", "resid_pdrop": "hidden_dropout_prob",
                "attn_pdrop": "attention_probs_dropout_prob"}
_NOMIC_REQUIRED = ("n_embd", "n_head", "n_layer", "n_inner", "n_positions", "vocab_size", "rotary_emb_base")
# NomicBERT settings that must be present with this value (their defaults in the remote code are not these)
_NOMIC_MUST = {"activation_function": "swiglu", "rotary_emb_fraction": 1.0, "qkv_proj_bias": False,
               "mlp_fc1_bias": False, "mlp_fc2_bias": False, "prenorm": False}
# ... and those that may be absent, but when present must have this value
_NOMIC_IF_SET = {"rotary_emb_interleaved": False, "rotary_emb_scale_base": None, "rotary_scaling_factor": None,
                 "parallel_block": False, "causal": False, "use_rms_norm": False, "scale_attn_weights": True,
                 "scale_attn_by_inverse_layer_idx": False, "num_experts": 0, "moe_every_n_layers": 0}
# GTE settings that may be absent (the remote code's default is this value) and must otherwise have this value
_GTE_IF_SET = {"position_embedding_type": "rope", "layer_norm_type": "layer_norm", "pack_qkv": True,
               "logn_attention_scale": False, "logn_attention_clip1": False}


def kind(d: Mapping[str, Any]) -> str | None:
    """'gte' for an original GTE config (model_type "new" or a New* class), 'nomic_bert' for NomicBERT's original
    GPT-2 style config (model_type "nomic_bert" with n_embd), None for any other config (read as it is)."""
    archs = d.get("architectures") or []
    first = archs[0] if isinstance(archs, list) and archs else None
    if d.get("model_type") == "new" or first in GTE_CLASSES:
        return "gte"
    if (d.get("model_type") == "nomic_bert" or first in NOMIC_CLASSES) and "n_embd" in d:
        return "nomic_bert"
    return None


def translate(d: Mapping[str, Any], where: str | Path = "config.json") -> dict:
    """config.json dict -> the transformers config dict fastenc reads (d itself, copied, when it is not an original
    GTE / NomicBERT config). where: the file, for errors. Raises ValueError naming the key that cannot be read or
    whose setting fastenc does not compute."""
    k = kind(d)
    if k == "gte":
        return _gte(d, str(where))
    if k == "nomic_bert":
        return _nomic(d, str(where))
    return dict(d)


def _err(where: str, what: str, key: str, msg: str) -> ValueError:
    return ValueError(f"from_pretrained: {where}: {what} config key {key!r} {msg}")


def _classes(d, where, what, table) -> list[str]:
    archs = d.get("architectures") or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise _err(where, what, "architectures", f"must be a list of class names, got {archs!r}")
    bad = [a for a in archs if a not in table]
    if bad:
        raise _err(where, what, "architectures", f"names {bad}, not one of {', '.join(table)} (the classes whose "
                   f"weight layout fastenc reads for this config)")
    return [table[a] for a in archs]


def _check_values(d, where, what, table, required: bool) -> None:
    for key, want in table.items():
        if key not in d:
            if required:
                raise _err(where, what, key, f"is missing; fastenc computes the model only with {key}={want!r}")
            continue
        got = d[key]
        if want is None or isinstance(want, bool):
            same = got is want
        else:  # a number: equal, and not a bool (True == 1)
            same = got == want and not isinstance(got, bool) or (want == 0 and got is None)
        if not same:
            raise _err(where, what, key, f"is {got!r}; fastenc computes this model only with {key}={want!r} "
                       f"(another value changes its math)")


def _positive_int(d, where, what, key) -> int:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise _err(where, what, key, f"must be a positive int, got {v!r}")
    return v


def _gte(d: Mapping[str, Any], where: str) -> dict:
    what = "GTE (model_type 'new')"
    archs = _classes(d, where, what, GTE_CLASSES)
    _check_values(d, where, what, _GTE_IF_SET, required=False)
    missing = [k for k in _GTE_SIZES if k not in d]
    if missing:
        raise _err(where, what, missing[0], f"is missing (needed: {', '.join(missing)}; the remote code's defaults "
                   f"are not assumed)")
    hidden = _positive_int(d, where, what, "hidden_size")
    heads = _positive_int(d, where, what, "num_attention_heads")
    if hidden % heads or (hidden // heads) % 2:
        raise _err(where, what, "num_attention_heads", f"({heads}) must divide hidden_size ({hidden}) into an even "
                   f"head dim for RoPE")
    theta = d["rope_theta"]
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
        raise _err(where, what, "rope_theta", f"must be a positive number, got {theta!r}")
    out = {k: d[k] for k in _COMMON + _GTE_COPY if k in d}
    out.pop("rope_theta")
    out["rope_parameters"] = _gte_rope(d.get("rope_scaling"), float(theta), hidden // heads, where, what)
    out.update(model_type="gte", architectures=archs)
    return out


def _gte_rope(scaling, theta: float, head_dim: int, where: str, what: str) -> dict:
    """rope_theta + rope_scaling of the original GTE config -> transformers' rope_parameters (see the module doc)."""
    if scaling is None:
        return {"rope_type": "default", "rope_theta": theta}
    if not isinstance(scaling, Mapping):
        raise _err(where, what, "rope_scaling", f"must be a dict or null, got {scaling!r}")
    extra = sorted(set(scaling) - {"type", "factor"})
    if scaling.get("type") != "ntk" or extra:
        raise _err(where, what, "rope_scaling", f"must be {{'type': 'ntk', 'factor': s}} (fixed NTK scaling) or null; "
                   f"got {dict(scaling)!r}")
    s = scaling.get("factor")
    if isinstance(s, bool) or not isinstance(s, (int, float)) or not s >= 1:
        raise _err(where, what, "rope_scaling", f"factor must be a number >= 1, got {s!r}")
    if s == 1:
        return {"rope_type": "default", "rope_theta": theta}
    return {"rope_type": "linear", "rope_theta": theta * float(s), "factor": float(s) ** (2.0 / head_dim)}


def _nomic(d: Mapping[str, Any], where: str) -> dict:
    what = "NomicBERT (original)"
    archs = _classes(d, where, what, NOMIC_CLASSES)
    missing = [k for k in _NOMIC_REQUIRED if k not in d]
    if missing:
        raise _err(where, what, missing[0], f"is missing (needed: {', '.join(missing)})")
    _check_values(d, where, what, _NOMIC_MUST, required=True)
    _check_values(d, where, what, _NOMIC_IF_SET, required=False)
    for key in ("n_embd", "n_head", "n_layer", "n_inner", "n_positions"):
        _positive_int(d, where, what, key)
    out = {k: d[k] for k in _COMMON if k in d}
    for old, new in _NOMIC_NAMES.items():
        if old not in d:
            continue
        if new in d and d[new] != d[old] and new != "max_position_embeddings":
            raise _err(where, what, old, f"({d[old]!r}) and {new!r} ({d[new]!r}) disagree")
        out[new] = d[old]
    base = d["rotary_emb_base"]
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not base > 0:
        raise _err(where, what, "rotary_emb_base", f"must be a positive number, got {base!r}")
    out["rope_parameters"] = {"rope_type": "default", "rope_theta": float(base)}
    out.update(hidden_act="silu", model_type="nomic_bert", architectures=archs)
    return out
