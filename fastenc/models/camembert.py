"""CamemBERT (Martin et al. 2019): RoBERTa's network (fastenc.models.roberta) with a French SentencePiece vocabulary,
under transformers' Camembert* names and model_type "camembert" (weights under "roberta." in the heads)."""
from __future__ import annotations

from dataclasses import dataclass

from fastenc.models import roberta


@dataclass
class CamembertConfig(roberta.RobertaConfig):
    """RoBERTa's fields and defaults (514 positions, one token type, pad 1) with camembert-base's vocabulary."""
    vocab_size: int = 32005
    model_type: str = "camembert"


class CamembertModel(roberta.RobertaModel):
    """The bare encoder (with the tanh pooler when the checkpoint has one)."""


class CamembertForSequenceClassification(roberta.RobertaForSequenceClassification):
    """RoBERTa's classification head on the <s> token."""


class CamembertForTokenClassification(roberta.RobertaForTokenClassification):
    """classifier(drop(hidden)) per token."""


class CamembertForQuestionAnswering(roberta.RobertaForQuestionAnswering):
    """qa_outputs(hidden) -> (start_logits, end_logits)."""


class CamembertForMaskedLM(roberta.RobertaForMaskedLM):
    """The masked-LM head, decoder tied to the word embedding."""


class CamembertForMultipleChoice(roberta.RobertaForMultipleChoice):
    """RoBERTa's multiple-choice head: the pooler on each choice's column 0, one score per choice."""


ARCHITECTURE = roberta.architecture_of("camembert", CamembertConfig, {
    "base": CamembertModel, "sequence_classification": CamembertForSequenceClassification,
    "token_classification": CamembertForTokenClassification,
    "question_answering": CamembertForQuestionAnswering, "masked_lm": CamembertForMaskedLM,
    "multiple_choice": CamembertForMultipleChoice}, "Camembert")
