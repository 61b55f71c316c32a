"""fastenc.from_pretrained on folders as GTE (model_type "new") and NomicBERT (GPT-2 names) are published on the hub:
the folder is built from a random transformers model by renaming its config keys and weights to the original ones
(the inverse mapping written out here, independently of fastenc's), and fastenc's output must equal transformers'.
A setting of another math is refused, naming its key; GTE's fixed NTK RoPE is checked against its own formula."""
from __future__ import annotations

import json
import math

import pytest
import torch

import fastenc
from fastenc import testing
from fastenc.models import hub_configs

transformers = pytest.importorskip("transformers")
safetensors = pytest.importorskip("safetensors.torch")

HIDDEN, HEADS, LAYERS, INTER, VOCAB = 72, 4, 2, 88, 301  # head dim 18
LENGTHS = [19, 1, 33]


def _batch(seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (len(LENGTHS), max(LENGTHS)), generator=g)
    mask = (torch.arange(max(LENGTHS))[None] < torch.tensor(LENGTHS)[:, None]).long()
    return ids * mask, mask


def _write(folder, config: dict, state: dict):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    safetensors.save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    return folder


def _compare(folder, hf, seed):
    ids, mask = _batch(seed)
    fe = fastenc.from_pretrained(folder)
    with torch.inference_mode():
        ref = hf(input_ids=ids, attention_mask=mask).last_hidden_state
        out = fe(ids, mask)
    keep = mask.bool()
    testing.assert_close(out[keep], ref[keep], name="last hidden state")
    return fe


# ---- GTE: transformers GteModel -> the original "new" layout ----

def _gte_original_state(sd: dict) -> dict:
    """transformers GteModel names -> gte-v1.5's: encoder.layer.N, attention.qkv_proj = [q; k; v],
    attention.o_proj, attn_ln, mlp.up_gate_proj = [up; gate], mlp.down_proj, mlp_ln."""
    out = {}
    for k, v in sd.items():
        if not k.startswith("layers."):
            out[k] = v
            continue
        n, rest = k.split(".", 2)[1:]
        p = f"encoder.layer.{n}."
        if rest.startswith("self_attn.q_proj."):
            leaf = rest.rsplit(".", 1)[1]
            parts = [sd[f"layers.{n}.self_attn.{x}_proj.{leaf}"] for x in "qkv"]
            out[p + f"attention.qkv_proj.{leaf}"] = torch.cat(parts)
        elif rest.startswith(("self_attn.k_proj.", "self_attn.v_proj.", "mlp.gate_proj.")):
            continue
        elif rest.startswith("self_attn.o_proj."):
            out[p + rest.replace("self_attn.o_proj", "attention.o_proj")] = v
        elif rest.startswith("mlp.up_proj."):
            leaf = rest.rsplit(".", 1)[1]
            out[p + f"mlp.up_gate_proj.{leaf}"] = torch.cat([v, sd[f"layers.{n}.mlp.gate_proj.{leaf}"]])
        else:
            rest = rest.replace("post_attention_layernorm", "attn_ln").replace("post_mlp_layernorm", "mlp_ln")
            out[p + rest] = v
    return out


def _gte_config(theta=500.0, ntk=None, type_vocab=0, act="gelu", **extra) -> dict:
    d = {"architectures": ["NewModel"], "model_type": "new",
         "auto_map": {"AutoConfig": "Alibaba-NLP/new-impl--configuration.NewConfig",
                      "AutoModel": "Alibaba-NLP/new-impl--modeling.NewModel"},
         "vocab_size": VOCAB, "hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
         "intermediate_size": INTER, "hidden_act": act, "hidden_dropout_prob": 0.1,
         "attention_probs_dropout_prob": 0.0, "max_position_embeddings": 512, "type_vocab_size": type_vocab,
         "layer_norm_type": "layer_norm", "layer_norm_eps": 1e-12, "position_embedding_type": "rope",
         "rope_theta": theta, "rope_scaling": None if ntk is None else {"type": "ntk", "factor": ntk},
         "pack_qkv": True, "unpad_inputs": True, "use_memory_efficient_attention": False,
         "logn_attention_scale": False, "logn_attention_clip1": False, "pad_token_id": 0}
    d.update(extra)
    return d


def _ntk_inv_freq(theta, s, dim):
    """Fixed NTK scaling (gte-v1.5's rope_scaling type 'ntk'): (theta*s)^(-2i/dim) / s^(2/dim)."""
    i = torch.arange(0, dim, 2, dtype=torch.float64)
    return (1.0 / (theta * s) ** (i / dim)) / s ** (2.0 / dim)


@pytest.mark.parametrize("ntk,type_vocab,act", [(None, 0, "gelu"), (2.0, 0, "gelu"), (8.0, 1, "silu")],
                         ids=["no-scaling", "ntk2-gelu", "ntk8-silu-types"])
def test_gte_original_folder_matches_transformers(tmp_path, ntk, type_vocab, act):
    torch.manual_seed(11)
    d = _gte_config(ntk=ntk, type_vocab=type_vocab, act=act)
    rope = hub_configs.translate(d)["rope_parameters"]
    hd = HIDDEN // HEADS
    if ntk is not None:  # transformers' linear RoPE with the translated parameters is the NTK table
        i = torch.arange(0, hd, 2, dtype=torch.float64)
        lin = 1.0 / rope["rope_theta"] ** (i / hd) / rope["factor"]
        assert torch.allclose(lin, _ntk_inv_freq(500.0, ntk, hd), rtol=1e-12)
    cfg = transformers.GteConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                                 num_attention_heads=HEADS, intermediate_size=INTER, hidden_act=act,
                                 max_position_embeddings=512, type_vocab_size=type_vocab, pad_token_id=0,
                                 rope_parameters=rope, attn_implementation="eager")
    hf = transformers.GteModel(cfg).eval()
    with torch.no_grad():  # non-trivial norms, so a swapped norm is seen
        for name, p in hf.named_parameters():
            if "LayerNorm" in name or "layernorm" in name:
                p.add_(torch.randn_like(p) * 0.2)
    folder = _write(tmp_path / "gte", d, _gte_original_state(hf.state_dict()))
    fe = _compare(folder, hf, seed=3)
    assert fe.config.model_type == "gte" and fe.config.rope_type == ("default" if ntk is None else "linear")
    fe.save_pretrained(tmp_path / "saved")  # saved in transformers' own layout and config
    back = transformers.GteModel.from_pretrained(tmp_path / "saved", attn_implementation="eager").eval()
    ids, mask = _batch(4)
    with torch.inference_mode():
        a = back(input_ids=ids, attention_mask=mask).last_hidden_state
        b = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    testing.assert_close(a[mask.bool()], b[mask.bool()], name="saved and reloaded by transformers")


def test_gte_original_sequence_classifier(tmp_path):
    """NewForSequenceClassification: the encoder under 'new.', its pooler and the classifier."""
    torch.manual_seed(12)
    d = _gte_config(ntk=2.0, architectures=["NewForSequenceClassification"], num_labels=3)
    cfg = transformers.GteConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                                 num_attention_heads=HEADS, intermediate_size=INTER, max_position_embeddings=512,
                                 type_vocab_size=0, pad_token_id=0, num_labels=3,
                                 rope_parameters=hub_configs.translate(d)["rope_parameters"],
                                 attn_implementation="eager")
    hf = transformers.GteForSequenceClassification(cfg).eval()
    sd = hf.state_dict()
    enc = _gte_original_state({k[len("gte."):]: v for k, v in sd.items() if k.startswith("gte.")})
    state = {f"new.{k}": v for k, v in enc.items()}
    state.update({k: v for k, v in sd.items() if not k.startswith("gte.")})
    folder = _write(tmp_path / "cls", {**d, "id2label": {"0": "a", "1": "b", "2": "c"}}, state)
    fe = fastenc.from_pretrained(folder)
    ids, mask = _batch(6)
    with torch.inference_mode():
        ref = hf(input_ids=ids, attention_mask=mask).logits
        out = fe(ids, mask)
    out = out.logits if hasattr(out, "logits") else out
    testing.assert_close(out, ref, name="logits")


@pytest.mark.parametrize("key,value", [("layer_norm_type", "rms_norm"), ("position_embedding_type", "absolute"),
                                       ("logn_attention_scale", True), ("pack_qkv", False),
                                       ("rope_scaling", {"type": "dynamic", "factor": 2.0}),
                                       ("rope_scaling", {"type": "ntk", "factor": 2.0, "mixed_b": 4}),
                                       ("rope_scaling", {"type": "ntk", "factor": 0.5}),
                                       ("architectures", ["NewForMultipleChoice"])])
def test_gte_original_refuses_other_math(tmp_path, key, value):
    d = _gte_config(**{key: value})
    with pytest.raises(ValueError, match=f"'{key}'"):
        hub_configs.translate(d)
    (tmp_path / "config.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match=f"config key '{key}'"):
        fastenc.from_pretrained(tmp_path)


def test_gte_original_needs_its_sizes():
    d = _gte_config()
    del d["intermediate_size"]
    with pytest.raises(ValueError, match="'intermediate_size' is missing"):
        hub_configs.translate(d)


# ---- NomicBERT: transformers NomicBertModel -> nomic-embed-text's layout ----

def _nomic_original_state(sd: dict) -> dict:
    """transformers NomicBertModel names -> nomic-embed-text's: emb_ln, encoder.layers.N.attn.Wqkv = [q; k; v],
    attn.out_proj, mlp.fc11 (up), mlp.fc12 (gate), mlp.fc2, norm1, norm2."""
    names = {"self_attn.o_proj": "attn.out_proj", "mlp.up_proj": "mlp.fc11", "mlp.gate_proj": "mlp.fc12",
             "mlp.down_proj": "mlp.fc2", "post_attention_layernorm": "norm1", "post_mlp_layernorm": "norm2"}
    out = {}
    for k, v in sd.items():
        if k.startswith("embeddings.LayerNorm."):
            out[k.replace("embeddings.LayerNorm", "emb_ln")] = v
            continue
        if not k.startswith("layers."):
            out[k] = v
            continue
        n, rest = k.split(".", 2)[1:]
        mod, leaf = rest.rsplit(".", 1)
        p = f"encoder.layers.{n}."
        if mod == "self_attn.q_proj":
            out[p + f"attn.Wqkv.{leaf}"] = torch.cat([sd[f"layers.{n}.self_attn.{x}_proj.{leaf}"] for x in "qkv"])
        elif mod in ("self_attn.k_proj", "self_attn.v_proj"):
            continue
        else:
            out[p + f"{names[mod]}.{leaf}"] = v
    return out


def _nomic_config(**extra) -> dict:
    d = {"architectures": ["NomicBertModel"], "model_type": "nomic_bert",
         "auto_map": {"AutoConfig": "nomic-ai/nomic-bert-2048--configuration_hf_nomic_bert.NomicBertConfig",
                      "AutoModel": "nomic-ai/nomic-bert-2048--modeling_hf_nomic_bert.NomicBertModel"},
         "activation_function": "swiglu", "attn_pdrop": 0.0, "causal": False, "dense_seq_output": True,
         "embd_pdrop": 0.0, "fused_bias_fc": True, "fused_dropout_add_ln": True, "initializer_range": 0.02,
         "layer_norm_epsilon": 1e-12, "max_trained_positions": 2048, "mlp_fc1_bias": False, "mlp_fc2_bias": False,
         "n_embd": HIDDEN, "n_head": HEADS, "n_inner": INTER, "n_layer": LAYERS, "n_positions": 1024,
         "pad_vocab_size_multiple": 1, "parallel_block": False, "parallel_block_tied_norm": False, "prenorm": False,
         "qkv_proj_bias": False, "reorder_and_upcast_attn": False, "resid_pdrop": 0.0, "rotary_emb_base": 1000,
         "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False, "rotary_emb_scale_base": None,
         "rotary_scaling_factor": None, "scale_attn_by_inverse_layer_idx": False, "scale_attn_weights": True,
         "type_vocab_size": 2, "use_flash_attn": True, "use_rms_norm": False, "use_xentropy": True,
         "vocab_size": VOCAB}
    d.update(extra)
    return d


def test_nomic_original_folder_matches_transformers(tmp_path):
    torch.manual_seed(13)
    cfg = transformers.NomicBertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                                       num_attention_heads=HEADS, intermediate_size=INTER,
                                       max_position_embeddings=1024, type_vocab_size=2,
                                       rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
                                       attn_implementation="eager")
    hf = transformers.NomicBertModel(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "LayerNorm" in name or "layernorm" in name:
                p.add_(torch.randn_like(p) * 0.2)
    folder = _write(tmp_path / "nomic", _nomic_config(), _nomic_original_state(hf.state_dict()))
    fe = _compare(folder, hf, seed=7)
    assert fe.config.model_type == "nomic_bert" and fe.config.max_position_embeddings == 1024
    assert math.isclose(fe.config.rope_theta, 1000.0) and fe.config.hidden_act == "silu"


@pytest.mark.parametrize("key,value", [("activation_function", "gelu"), ("rotary_emb_fraction", 0.5),
                                       ("rotary_emb_interleaved", True), ("qkv_proj_bias", True),
                                       ("mlp_fc1_bias", True), ("prenorm", True), ("rotary_scaling_factor", 2.0),
                                       ("use_rms_norm", True), ("parallel_block", True),
                                       ("architectures", ["NomicBertForPreTraining"])])
def test_nomic_original_refuses_other_math(tmp_path, key, value):
    d = _nomic_config(**{key: value})
    (tmp_path / "config.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match=f"config key '{key}'"):
        fastenc.from_pretrained(tmp_path)


def test_nomic_original_flags_must_be_stated():
    d = _nomic_config()
    del d["qkv_proj_bias"]
    with pytest.raises(ValueError, match="'qkv_proj_bias' is missing"):
        hub_configs.translate(d)
    d = _nomic_config(hidden_size=HIDDEN + 8)  # a transformers name beside the original one, disagreeing
    with pytest.raises(ValueError, match="'n_embd'"):
        hub_configs.translate(d)


def test_other_configs_pass_through():
    d = {"model_type": "bert", "architectures": ["BertModel"], "hidden_size": 32}
    assert hub_configs.kind(d) is None and hub_configs.translate(d) == d
    assert hub_configs.kind({"model_type": "nomic_bert", "hidden_size": 32}) is None  # transformers' own names
