"""The original hub configs of the GTE and NomicBERT base checkpoints `fastenc bench models` runs at (their sizes and
RoPE), and their transformers config settings through fastenc.models.hub_configs, as from_pretrained reads them."""
from __future__ import annotations

GTE_BASE_EN_V15 = {"architectures": ["NewModel"], "model_type": "new", "vocab_size": 30528, "hidden_size": 768,
                   "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072, "hidden_act": "gelu",
                   "max_position_embeddings": 8192, "type_vocab_size": 0, "layer_norm_eps": 1e-12,
                   "layer_norm_type": "layer_norm", "position_embedding_type": "rope", "rope_theta": 500000,
                   "rope_scaling": {"type": "ntk", "factor": 2.0}, "pack_qkv": True, "pad_token_id": 0}
NOMIC_EMBED_TEXT_V15 = {"architectures": ["NomicBertModel"], "model_type": "nomic_bert", "vocab_size": 30528,
                        "n_embd": 768, "n_head": 12, "n_layer": 12, "n_inner": 3072, "n_positions": 8192,
                        "type_vocab_size": 2, "layer_norm_epsilon": 1e-12, "activation_function": "swiglu",
                        "rotary_emb_base": 1000, "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False,
                        "rotary_scaling_factor": None, "qkv_proj_bias": False, "mlp_fc1_bias": False,
                        "mlp_fc2_bias": False, "prenorm": False}
_SIZE_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
              "max_position_embeddings", "type_vocab_size", "layer_norm_eps", "rope_parameters", "pad_token_id")


def hub_sizes(original: dict) -> dict:
    """The transformers config settings of an original hub config (fastenc.models.hub_configs.translate)."""
    from fastenc.models import hub_configs

    d = hub_configs.translate(original)
    return {k: d[k] for k in _SIZE_KEYS if k in d}
