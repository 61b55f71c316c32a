"""model.save_pretrained(folder) after training: transformers' from_pretrained loads the folder with the trained
weights and gives fastenc's outputs, for every architecture and head; fastenc.from_pretrained reads it back too."""
from __future__ import annotations

import pytest
import torch

import fastenc
import _models_hf as _hf
from _train import batch, hf_model

CASES = [("bert", "base"), ("bert", "sequence_classification"), ("bert", "token_classification"),
         ("modernbert", "base"), ("modernbert", "sequence_classification"), ("modernbert", "token_classification"),
         ("vit", "base"), ("vit", "image_classification")]


def _outputs(model, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        out = model(**inputs)
    if isinstance(out, torch.Tensor):
        return out
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


@pytest.mark.parametrize("arch,task", CASES, ids=[f"{a}-{t}" for a, t in CASES])
def test_saved_folder_loads_in_transformers_with_the_trained_weights(arch, task, tmp_path):
    hf = hf_model(arch, task)
    fe = fastenc.from_hf(hf).train()
    inputs = batch(arch, task, lengths=[6, 11, 2])
    labels = inputs.pop("labels", None)
    opt = torch.optim.SGD(fe.parameters(), lr=0.5)
    for _ in range(2):  # move every weight away from the transformers model's
        out = fe(**inputs, labels=labels) if labels is not None else fe(**inputs)
        loss = out.loss if labels is not None else out.float().pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    fe.eval()
    if arch == "bert" and task == "base":
        fe.config.hf_config = None  # the config made from fastenc's own fields
    fe.save_pretrained(tmp_path / "m")
    cls = getattr(_hf.transformers, type(hf).__name__)
    loaded = cls.from_pretrained(tmp_path / "m", attn_implementation="eager").eval()
    mine, theirs = _outputs(fe, inputs), _outputs(loaded, inputs)
    before = _outputs(hf.eval(), inputs)
    mask = inputs.get("attention_mask")
    sel = (lambda t: t[mask.bool()]) if mask is not None and mine.dim() == 3 else (lambda t: t)
    assert float((sel(mine) - sel(before)).abs().max()) > 1e-3  # (training changed the outputs)
    assert float((sel(mine) - sel(theirs)).abs().max()) <= 1e-4
    again = fastenc.from_pretrained(tmp_path / "m")
    assert float((sel(_outputs(again, inputs)) - sel(mine)).abs().max()) <= 1e-5


TEXTS = ["the lazy fox runs", "a fast encoder saves the weights and the tokenizer", "dog"]


def _tokenizer_files(folder, sentence_transformers: bool) -> None:
    """A WordPiece tokenizer trained on a few strings, saved by transformers (tokenizer.json +
    tokenizer_config.json), plus vocab.txt and, optionally, sentence-transformers' pooling settings."""
    import json

    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    words = ["the quick brown fox jumps over the lazy dog", "a fast encoder runs packed tokens",
             "save the tokenizer beside the weights"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(words * 3, trainers.WordPieceTrainer(
        vocab_size=120, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    _hf.transformers.BertTokenizerFast(tokenizer_object=tok).save_pretrained(folder)
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    (folder / "vocab.txt").write_text("".join(w + "\n" for w, _ in vocab))
    if sentence_transformers:
        (folder / "1_Pooling").mkdir()
        (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
        (folder / "modules.json").write_text(json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))


@pytest.mark.parametrize("task", ["base", "sequence_classification"])
def test_saved_folder_carries_the_tokenizer(task, tmp_path):
    from transformers import AutoTokenizer

    src, out = tmp_path / "src", tmp_path / "out"
    hf = _hf.bert(task)
    hf.save_pretrained(src)
    _tokenizer_files(src, sentence_transformers=task == "base")
    want = AutoTokenizer.from_pretrained(src)(TEXTS)["input_ids"]
    fe = fastenc.from_pretrained(src)
    fe.encode(TEXTS[:1], max_length=4)  # (encode truncates the tokenizer it holds; the copy is the folder's)
    fe.save_pretrained(out)
    st_files = {"modules.json", "1_Pooling"} if task == "base" else set()
    assert {p.name for p in out.iterdir()} == {"config.json", "model.safetensors", "tokenizer.json",
                                               "tokenizer_config.json", "vocab.txt"} | st_files
    assert (out / "vocab.txt").read_bytes() == (src / "vocab.txt").read_bytes()
    src.rename(tmp_path / "gone")  # the saved folder stands alone
    assert AutoTokenizer.from_pretrained(out)(TEXTS)["input_ids"] == want
    again = fastenc.from_pretrained(out)
    assert again.encode_defaults == fe.encode_defaults
    if task == "base":
        assert fe.encode_defaults == {"pooling": "mean", "normalize": True}
        torch.testing.assert_close(again.encode(TEXTS), fe.encode(TEXTS), rtol=0, atol=0)
    else:
        enc = AutoTokenizer.from_pretrained(out)(TEXTS, padding=True, return_tensors="pt")
        loaded = _hf.transformers.BertForSequenceClassification.from_pretrained(out, attn_implementation="eager")
        with torch.no_grad():
            theirs = loaded.eval()(**enc).logits
            mine = again(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
        assert float((mine - theirs).abs().max()) <= 1e-4
    fe.save_pretrained(tmp_path / "again")  # its folder gone: tokenizer.json from the loaded tokenizer
    assert (tmp_path / "again" / "tokenizer.json").is_file() and not (tmp_path / "again" / "vocab.txt").exists()
    reread = fastenc.from_pretrained(tmp_path / "again").tokenizer
    assert [e.ids for e in reread.encode_batch(TEXTS)] == want
    assert AutoTokenizer.from_pretrained(tmp_path / "again")(TEXTS)["input_ids"] == want
