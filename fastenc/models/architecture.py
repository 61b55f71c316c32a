"""The architecture table: every encoder family fastenc runs is one `Architecture`, declared in its own model file
(fastenc/models/bert.py, modernbert.py, vit.py, ...) and registered by one line in `_MODULES` below. Everything
that needs to know an architecture asks this table: from_hf / from_pretrained (config translation, weight map,
heads), accelerate (the transformers classes, forward arguments and output types), save_pretrained (the inverse
map, the config.json), load_lora / add_lora (the PEFT module names), encode (tokenizer, pooling defaults), the
benchmarks and `fastenc info`.

An Architecture declares:
  model_type     the config.json "model_type" (and the fastenc config's model_type)
  config         the fastenc config class: `config.from_dict(hf_config_dict, **override)`
  heads          task -> (fastenc model class, transformers class name); "base" is the bare encoder. Tasks:
                 base, sequence_classification, token_classification, question_answering, masked_lm,
                 image_classification, image_classification_with_teacher (DeiT's distilled head), image_embedding
                 (a projection of the pooled output, CLIP's image_embeds), text_embedding (CLIP's text_embeds),
                 multiple_choice (input_ids (batch, choices, seq) -> (batch, choices))
  weight_map     (cfg, task, prefix) -> [(fastenc name, (hf names...), kind)] (see fastenc.models.convert); the
                 same list maps both directions
  head_prefix    the encoder's attribute prefix inside the transformers head classes ("bert.")
  encoder_of     other transformers classes whose encoder loads as the base model (their own head dropped)
  modality       "text" (input_ids, packed tokens, a tokenizer.json), "vision" (pixel_values) or "text+vision" (a
                 two-tower model, CLIPModel / SiglipModel: both, a text tower and a vision tower whose embeddings
                 meet in one space; its base forward takes input_ids, pixel_values and attention_mask, and the
                 consumers that run one modality (the corpus job, the server, the benchmarks) leave it out)
  inputs         the transformers forward arguments the fastenc path serves (beyond each head's label names)
  token_types    whether the fastenc text models take token_type_ids (third positional argument)
  legacy_names   (regex, replacement) renames of older checkpoint keys, applied before the map
  legacy_fused   (regex with groups (module, leaf), (part names...)) fused checkpoint tensors split into the
                 transformers-5 ones after the renames (fastenc.models.convert.unfuse; GTE's qkv_proj)
  config_overrides  (task, has_pooler) -> fastenc config overrides fixed by the head class (BERT's pooler)
  hf_config      cfg -> extra config.json entries save_pretrained writes (ModernBERT's rope_parameters)
  lora_targets   PEFT's usual target modules for this architecture (benchmarks, `fastenc finetune --lora`)
  pooling        the sentence-embedding pooling `encode` uses when the folder does not say ("mean" | "cls")
  base_output    the transformers output class name of the base model (accelerate)
  head_outputs   task -> "module:Class" of a transformers output type that is not in transformers.modeling_outputs
                 (accelerate; e.g. DeiT's distilled classification output)
  tiny_config    (task, hidden=, heads=, layers=, **kw) -> a small transformers config of this architecture, for
                 tests: `tiny_model(task, seed)` builds the transformers head class on it with random weights (the
                 test factories of tests/models/_models_hf.py are these, one per registered architecture)
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable, Mapping

# One line per architecture: the module under fastenc.models that declares `ARCHITECTURE`.
_MODULES = (
    "bert",
    "modernbert",
    "vit",
    "deit",
    "dinov2",
    "dinov2_with_registers",
    "clip_vision",
    "siglip_vision",
    "clip_text",
    "siglip_text",
    "clip",
    "siglip",
    "distilbert",
    "electra",
    "roberta",
    "xlm_roberta",
    "camembert",
    "albert",
    "gte",
    "nomic_bert",
    "jina_embeddings_v3",
    "mpnet",
    "deberta_v2",
)

TASKS = ("base", "sequence_classification", "token_classification", "question_answering", "masked_lm",
         "image_classification", "image_classification_with_teacher", "image_embedding", "text_embedding",
         "multiple_choice")
MODALITIES = ("text", "vision", "text+vision")
# The label arguments each head's forward takes (transformers' names).
LABEL_ARGS = {"base": (), "sequence_classification": ("labels",), "token_classification": ("labels",),
              "question_answering": ("start_positions", "end_positions"), "masked_lm": ("labels",),
              "image_classification": ("labels",), "image_classification_with_teacher": (),
              "image_embedding": (), "text_embedding": (), "multiple_choice": ("labels",)}


@dataclass(frozen=True)
class Architecture:
    model_type: str
    config: type
    heads: Mapping[str, tuple[type, str]]
    weight_map: Callable
    head_prefix: str
    modality: str = "text"
    inputs: frozenset = frozenset({"input_ids", "attention_mask", "token_type_ids", "return_dict",
                                   "num_items_in_batch"})
    token_types: bool = True
    encoder_of: tuple[str, ...] = ()
    legacy_names: tuple = ()
    legacy_fused: tuple = ()
    config_overrides: Callable | None = None
    hf_config: Callable | None = None
    lora_targets: tuple[str, ...] = ()
    pooling: str = "mean"
    base_output: str = "BaseModelOutput"
    head_outputs: Mapping[str, str] = field(default_factory=dict)
    tiny_config: Callable | None = None

    def __post_init__(self):
        bad = [t for t in self.heads if t not in TASKS]
        if bad or "base" not in self.heads:
            raise ValueError(f"Architecture {self.model_type}: heads must include 'base' and only tasks of {TASKS}, "
                             f"got {sorted(self.heads)}")
        if self.modality not in MODALITIES:
            raise ValueError(f"Architecture {self.model_type}: modality must be one of {MODALITIES}, got "
                             f"{self.modality!r}")

    @property
    def modalities(self) -> tuple[str, ...]:
        """The inputs the architecture takes: ("text",), ("vision",) or ("text", "vision")."""
        return tuple(self.modality.split("+"))

    def model_class(self, task: str) -> type:
        if task not in self.heads:
            raise ValueError(f"{self.model_type}: unsupported head {task!r}; supported: {', '.join(self.heads)}")
        return self.heads[task][0]

    def hf_class(self, task: str) -> str:
        self.model_class(task)
        return self.heads[task][1]

    def prefix(self, task: str) -> str:
        """The prefix of the encoder's weights in the transformers class of `task`."""
        return "" if task == "base" else self.head_prefix

    def entries(self, cfg, task: str, prefix: str | None = None) -> list:
        return self.weight_map(cfg, task, self.prefix(task) if prefix is None else prefix)

    def overrides(self, task: str, has_pooler: bool) -> dict:
        return {} if self.config_overrides is None else dict(self.config_overrides(task, has_pooler))

    def tiny_model(self, task: str = "base", seed: int = 0, **kw):
        """A small transformers model of `task` on tiny_config(task, **kw), random weights drawn from `seed`
        (random_init), in eval mode. Needs transformers."""
        if self.tiny_config is None:
            raise ValueError(f"{self.model_type}: no tiny_config is declared")
        import transformers

        return random_init(getattr(transformers, self.hf_class(task))(self.tiny_config(task, **kw)), seed)


def random_init(model, seed: int):
    """Random non-trivial weights everywhere (norm weights near 1, every other tensor ~0.05 N(0, 1)),
    deterministic per seed; the model in eval mode."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and name.endswith("weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    return model.eval()


_TABLE: dict[str, Architecture] | None = None


def heads_of(*classes: type) -> dict[str, tuple[type, str]]:
    """Architecture.heads from fastenc model classes named as their transformers classes: task (each class's
    `task`) -> (class, its name)."""
    return {cls.task: (cls, cls.__name__) for cls in classes}


def architectures() -> dict[str, Architecture]:
    """model_type -> Architecture, every registered one (their modules imported on the first call)."""
    global _TABLE
    if _TABLE is None:
        table = {}
        for mod in _MODULES:
            arch = importlib.import_module(f"fastenc.models.{mod}").ARCHITECTURE
            if arch.model_type in table:
                raise ValueError(f"architecture {arch.model_type!r} is registered twice")
            table[arch.model_type] = arch
        _TABLE = table
    return _TABLE


def get(model_type: str) -> Architecture:
    table = architectures()
    if model_type not in table:
        raise ValueError(f"unsupported model_type {model_type!r}; supported: {', '.join(table)}")
    return table[model_type]


def hf_classes() -> dict[str, tuple[str, str]]:
    """transformers class name -> (model_type, task), every head of every architecture."""
    return {name: (a.model_type, task) for a in architectures().values() for task, (_, name) in a.heads.items()}


def encoder_classes() -> dict[str, str]:
    """transformers class name whose encoder loads as a base model -> model_type."""
    return {name: a.model_type for a in architectures().values() for name in a.encoder_of}


def of_model(model) -> Architecture:
    """The Architecture of a fastenc model (its config's model_type)."""
    return get(getattr(getattr(model, "config", None), "model_type", None))
