"""Jina-embeddings-v3 (transformers' JinaEmbeddingsV3Model, XLM-RoBERTa with RoPE) on packed tokens: GTE's blocks
(fastenc.models.gte: word + token-type embeddings and LayerNorm, post-LayerNorm blocks, RoPE on q and k with theta
20000 by default, biases in every projection) with a plain MLP fc2(act(fc1(x))) instead of the gated one, and
XLM-RoBERTa's heads under its names ("roberta." prefix): a tanh pooler on the base model (when the checkpoint has
one), the classification head out_proj(tanh(dense(<s>))), token classification, question answering, and the masked-LM
head tied to the word embedding.

Task adapters: the transformers checkpoint (jina-embeddings-v3-hf) ships its five task-specific LoRA adapters as PEFT
adapter folders named after the task (retrieval_query, retrieval_passage, separation, classification,
text_matching). from_pretrained(folder) loads those present as unmerged adapters (load_task_adapters);
encode(texts, adapter="retrieval.query") runs with one of them (no adapter by default: the bare backbone).
encode() mean-pools by default, as the model card does.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from fastenc.layers import Linear
from fastenc.models import gte, losses
from fastenc.models.architecture import Architecture, heads_of
from fastenc.models.bert import question_answering
from fastenc.models.convert import Entry, lin
from fastenc.models.roberta import RobertaClassificationHead, pooler_override

TASKS = ("retrieval.query", "retrieval.passage", "separation", "classification", "text-matching")


def adapter_name(task: str) -> str:
    """The adapter (and checkpoint subfolder) name of a Jina-v3 task: 'retrieval.query' -> 'retrieval_query'."""
    if not isinstance(task, str):
        raise TypeError(f"adapter must be a str (one of {', '.join(TASKS)}), got {type(task).__name__}")
    return task.replace(".", "_").replace("-", "_")


@dataclass
class JinaEmbeddingsV3Config(gte.GteConfig):
    """Jina-embeddings-v3 (config names as transformers' JinaEmbeddingsV3Config)."""
    vocab_size: int = 250002
    max_position_embeddings: int = 8194
    layer_norm_eps: float = 1e-5
    attention_probs_dropout_prob: float = 0.1
    add_pooling_layer: bool = True
    rope_theta: float = 20000.0
    model_type: str = "jina_embeddings_v3"

    DEFAULT_THETA = 20000.0
    GATED = False

    @classmethod
    def from_dict(cls, d, **override) -> "JinaEmbeddingsV3Config":
        if d.get("lora_adaptations"):  # (the original remote-code checkpoint: adapters stacked inside the weights)
            raise ValueError(f"{cls.__name__}: a config with lora_adaptations is the original jina-embeddings-v3 "
                             f"layout (task adapters stacked inside its weights), which fastenc does not read; use "
                             f"the transformers checkpoint (jina-embeddings-v3-hf), whose task adapters are PEFT "
                             f"folders")
        return super().from_dict(d, **override)


class JinaEmbeddingsV3Layer(gte.GteLayer):
    """GteLayer with the plain MLP fc2(act(fc1(x)))."""

    def __init__(self, cfg: JinaEmbeddingsV3Config):
        super().__init__(cfg, gated=False)


class _Jina:
    """The task adapters: loaded from a checkpoint's PEFT subfolders, chosen per encode() call."""
    layer_class = JinaEmbeddingsV3Layer

    def load_tokenizer(self, folder) -> None:
        super().load_tokenizer(folder)
        self.load_task_adapters(folder, missing_ok=True)

    def load_task_adapters(self, folder, missing_ok: bool = False) -> list[str]:
        """Load the task adapters found in `folder`'s subfolders (retrieval_query, ...; each a PEFT adapter folder
        with adapter_config.json) as unmerged adapters of those names; none is made active. Returns the names
        loaded. missing_ok=False: a folder holding none of them is an error."""
        folder = Path(folder)
        loaded = []
        for task in TASKS:
            name = adapter_name(task)
            sub = folder / name
            if (sub / "adapter_config.json").is_file() and name not in self.lora_adapters["unmerged"]:
                active = self.lora_adapters["active"]
                self.load_lora(sub, merge=False, adapter_name=name)
                self.set_adapter(active)
                loaded.append(name)
        if not loaded and not missing_ok:
            raise ValueError(f"load_task_adapters: {folder} holds no task adapter folder (expected one of "
                             f"{', '.join(adapter_name(t) for t in TASKS)} with adapter_config.json)")
        return loaded

    def encode(self, inputs, attention_mask=None, *, adapter: str | None = None, **kw) -> torch.Tensor:
        """TextEncoderMixin.encode, with the task adapter `adapter` ('retrieval.query', 'retrieval.passage',
        'separation', 'classification', 'text-matching', or its folder name 'retrieval_query', ...) active for the
        call; None: the active adapter, if any (by default none: the backbone)."""
        if adapter is None:
            return super().encode(inputs, attention_mask, **kw)
        name = adapter_name(adapter)
        have = self.lora_adapters["unmerged"]
        if name not in have:
            raise ValueError(f"encode: adapter {adapter!r} is not loaded (loaded: {have}); tasks: {', '.join(TASKS)}; "
                             f"load them with from_pretrained(folder) or load_task_adapters(folder)")
        with self.use_adapter(name):
            return super().encode(inputs, attention_mask, **kw)


class JinaEmbeddingsV3Model(_Jina, gte.GteModel):
    pass


class JinaEmbeddingsV3ForSequenceClassification(_Jina, gte.GteModel):
    """logits = out_proj(drop(tanh(dense(drop(<s>))))): (batch, num_labels), no pooler. labels= (batch,) int / float
    -> SequenceClassifierOutput(loss, logits)."""
    task = "sequence_classification"

    def __init__(self, config: JinaEmbeddingsV3Config):
        super().__init__(dataclasses.replace(config, add_pooling_layer=False))
        self.classifier = RobertaClassificationHead(self.config)

    def classify(self, first: torch.Tensor) -> torch.Tensor:
        """first (batch, hidden): each row's first token -> (batch, num_labels)."""
        return self.classifier(first)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        return losses.classify_sequence(self, input_ids, attention_mask, token_type_ids, labels)


class JinaEmbeddingsV3ForTokenClassification(_Jina, gte.GteForTokenClassification):
    pass


class JinaEmbeddingsV3ForQuestionAnswering(_Jina, gte.GteModel):
    """qa_outputs(hidden) -> (start_logits, end_logits), each (batch, seq), zeros at padding; start_positions /
    end_positions -> QuestionAnsweringModelOutput with transformers' loss (its softmax over the padded columns too,
    their logits computed as transformers does: _run(padded=True))."""
    task = "question_answering"

    def __init__(self, config: JinaEmbeddingsV3Config):
        losses.check_qa_labels_count(type(self).__name__, config)
        super().__init__(dataclasses.replace(config, add_pooling_layer=False))
        self.qa_outputs = Linear(config.hidden_size, 2)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, start_positions=None,
                end_positions=None):
        return question_answering(self, input_ids, attention_mask, token_type_ids, start_positions, end_positions)


class JinaEmbeddingsV3ForMaskedLM(_Jina, gte.GteForMaskedLM):
    pass


# The checkpoint layout transformers' save_pretrained writes for Jina-v3: emb_ln, encoder.layers.N, mixer.Wqkv
# ([q; k; v]), mixer.out_proj, norm1, norm2.
LEGACY_NAMES = (
    (re.compile(r"(^|\.)emb_ln\."), r"\1embeddings.LayerNorm."),
    (re.compile(r"(^|\.)encoder\.layers\.(\d+)\."), r"\1layers.\2."),
    (re.compile(r"\.mixer\.out_proj\."), ".self_attn.o_proj."),
    (re.compile(r"(layers\.\d+)\.norm1\."), r"\1.post_attention_layernorm."),
    (re.compile(r"(layers\.\d+)\.norm2\."), r"\1.post_mlp_layernorm."),
)
LEGACY_FUSED = (
    (r"(.*layers\.\d+)\.mixer\.Wqkv\.(weight|bias)", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
)

_MLM = ("lm_head.dense", "lm_head.layer_norm", "lm_head.bias")


def weight_map(cfg: JinaEmbeddingsV3Config, task: str, prefix: str = "") -> list[Entry]:
    """fastenc name <-> transformers name of every Jina-v3 tensor (prefix "roberta." inside the head classes): GTE's
    map with the plain MLP, XLM-RoBERTa's head names."""
    m = gte.weight_map(cfg, "base", prefix, gated=False)
    if task == "sequence_classification":
        m += lin("classifier.dense", "classifier.dense") + lin("classifier.out_proj", "classifier.out_proj")
    elif task == "token_classification":
        m += lin("classifier", "classifier")
    elif task == "question_answering":
        m += lin("qa_outputs", "qa_outputs")
    elif task == "masked_lm":
        m += gte.weight_map(cfg, task, prefix, gated=False, mlm=_MLM)[len(m):]
    return m


def tiny_config(task: str = "base", hidden: int = 64, heads: int = 4, layers: int = 2, **kw):
    """A small transformers JinaEmbeddingsV3Config for tests (Architecture.tiny_config; eager attention)."""
    import transformers

    kw.setdefault("max_position_embeddings", 4096)
    return transformers.JinaEmbeddingsV3Config(vocab_size=211, hidden_size=hidden, num_hidden_layers=layers,
                                               num_attention_heads=heads, intermediate_size=hidden + 24,
                                               pad_token_id=1, type_vocab_size=2,
                                               num_labels=2 if task == "question_answering" else 5,
                                               attn_implementation="eager", **kw)


ARCHITECTURE = Architecture(
    model_type="jina_embeddings_v3",
    config=JinaEmbeddingsV3Config,
    heads=heads_of(JinaEmbeddingsV3Model, JinaEmbeddingsV3ForSequenceClassification,
                   JinaEmbeddingsV3ForTokenClassification, JinaEmbeddingsV3ForQuestionAnswering,
                   JinaEmbeddingsV3ForMaskedLM),
    weight_map=weight_map,
    head_prefix="roberta.",
    legacy_names=LEGACY_NAMES,
    legacy_fused=LEGACY_FUSED,
    config_overrides=pooler_override,
    hf_config=gte.hf_config,
    lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"),
    pooling="mean",
    base_output="BaseModelOutputWithPooling",
    tiny_config=tiny_config,
)
