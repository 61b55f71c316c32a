"""XLM-RoBERTa (Conneau et al. 2019): RoBERTa's network (fastenc.models.roberta) with a 250k-token vocabulary,
under transformers' XLMRoberta* names and model_type "xlm-roberta" (weights under "roberta." in the heads)."""
from __future__ import annotations

from dataclasses import dataclass

from fastenc.models import roberta


@dataclass
class XLMRobertaConfig(roberta.RobertaConfig):
    vocab_size: int = 250002
    model_type: str = "xlm-roberta"


class XLMRobertaModel(roberta.RobertaModel):
    """The bare encoder (with the tanh pooler when the checkpoint has one)."""


class XLMRobertaForSequenceClassification(roberta.RobertaForSequenceClassification):
    """RoBERTa's classification head on the <s> token."""


class XLMRobertaForTokenClassification(roberta.RobertaForTokenClassification):
    """classifier(drop(hidden)) per token."""


class XLMRobertaForQuestionAnswering(roberta.RobertaForQuestionAnswering):
    """qa_outputs(hidden) -> (start_logits, end_logits)."""


class XLMRobertaForMaskedLM(roberta.RobertaForMaskedLM):
    """The masked-LM head, decoder tied to the word embedding."""


class XLMRobertaForMultipleChoice(roberta.RobertaForMultipleChoice):
    """RoBERTa's multiple-choice head: the pooler on each choice's column 0, one score per choice."""


ARCHITECTURE = roberta.architecture_of("xlm-roberta", XLMRobertaConfig, {
    "base": XLMRobertaModel, "sequence_classification": XLMRobertaForSequenceClassification,
    "token_classification": XLMRobertaForTokenClassification,
    "question_answering": XLMRobertaForQuestionAnswering, "masked_lm": XLMRobertaForMaskedLM,
    "multiple_choice": XLMRobertaForMultipleChoice}, "XLMRoberta")
