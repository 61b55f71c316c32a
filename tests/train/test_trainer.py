"""transformers.Trainer trains a model made by fastenc.accelerate: a few steps on a tiny BERT, on CPU, the loss
falls and fastenc's path ran (fastenc::attention in the profiler, no FallbackWarning)."""
from __future__ import annotations

import warnings

import torch

import fastenc
import _models_hf as _hf
from _train import hf_model
from fastenc.models.hf import FallbackWarning

transformers = _hf.transformers


class _Rows(torch.utils.data.Dataset):
    """Eight fixed sequences of mixed lengths with a label each (int ids; the collator pads)."""

    def __init__(self):
        g = torch.Generator().manual_seed(5)
        self.rows = [{"input_ids": torch.randint(3, 211, (n,), generator=g).tolist(), "labels": i % 5}
                     for i, n in enumerate([5, 17, 9, 3, 12, 7, 21, 2])]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def _collate(rows):
    width = max(len(r["input_ids"]) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r["input_ids"])] = torch.tensor(r["input_ids"])
        mask[i, :len(r["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([r["labels"] for r in rows])}


def test_trainer_trains_an_accelerated_model(tmp_path):
    model = fastenc.accelerate(hf_model("bert", "sequence_classification", hidden_dropout_prob=0.1))
    args = transformers.TrainingArguments(output_dir=str(tmp_path), max_steps=12, per_device_train_batch_size=4,
                                          learning_rate=3e-3, logging_steps=1, save_strategy="no", use_cpu=True,
                                          report_to=[], seed=0, disable_tqdm=True, remove_unused_columns=False)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_Rows(), data_collator=_collate)
    with warnings.catch_warnings(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        warnings.simplefilter("error", FallbackWarning)
        trainer.train()
    names = {e.key for e in prof.key_averages()}
    assert "fastenc::attention" in names and "fastenc::attention_bwd" in names
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 12
    assert sum(losses[-4:]) < 0.9 * sum(losses[:4]), losses
