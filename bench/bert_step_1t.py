"""BERT-base sequence classification training step (forward + cross-entropy + backward + AdamW) on one thread, in
thread CPU time (usable on a loaded machine), the providers interleaved in one process: fastenc with the full last
layer (every token, then the first token pooled: "before"), fastenc as it runs (the last layer's Wo, MLP and norms
on the first rows only: "now") and transformers with sdpa (+ PEFT for LoRA). Full fine-tuning and LoRA (r 8,
query/value, lora_dropout 0.1); the config's dropouts; BERT-base widths and vocabulary, random weights, 8 x 128.
Usage: python bench/bert_step_1t.py full|lora ROUNDS [LAYERS (default 12)]. Prints each round's times, then medians
and paired ratios [min, max]."""
import sys, time, statistics, copy, torch, torch.nn.functional as F
import transformers as tf, fastenc
from fastenc.benchmark.models import text_batch
torch.set_num_threads(1)
mode, rounds = sys.argv[1], int(sys.argv[2])
layers = int(sys.argv[3]) if len(sys.argv) > 3 else 12
torch.manual_seed(0)
hf = tf.BertForSequenceClassification(tf.BertConfig(num_labels=2, num_hidden_layers=layers)); hf.set_attn_implementation("sdpa")
inputs = text_batch([128] * 8, hf.config.vocab_size); labels = torch.randint(0, 2, (8,))
ids, mask = inputs["input_ids"], inputs["attention_mask"]
fe, fe_old = fastenc.from_hf(copy.deepcopy(hf)), fastenc.from_hf(copy.deepcopy(hf))
if mode == "lora":
    from peft import LoraConfig, get_peft_model
    for m in (fe, fe_old):
        m.add_lora(r=8, lora_alpha=16, target_modules=["query", "value"], lora_dropout=0.1)
    hf = get_peft_model(hf, LoraConfig(task_type="SEQ_CLS", r=8, lora_alpha=16, lora_dropout=0.1,
                                       target_modules=["query", "value"]))
fe.train(); fe_old.train(); hf.train()
def old_forward():
    x, batch = fe_old._encode(ids, mask)
    return fe_old.classify(batch.first_tokens(x))
def stepper(m, loss_fn):
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-4)
    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn().backward(); opt.step()
    return step
steps = {"before": stepper(fe_old, lambda: F.cross_entropy(old_forward(), labels)),
         "now": stepper(fe, lambda: fe(ids, mask, labels=labels).loss),
         "hf": stepper(hf, lambda: hf(**inputs, labels=labels).loss)}
for s in steps.values(): s()
t = {k: [] for k in steps}
for _ in range(rounds):
    for k, s in steps.items():
        a = time.thread_time(); s(); t[k].append(time.thread_time() - a)
    print("  ".join(f"{k} {v[-1]*1e3:.0f} ms" for k, v in t.items()), flush=True)
def ratio(a, b):
    r = sorted(x / y for x, y in zip(t[a], t[b])); return f"{statistics.median(r):.3f} [{r[0]:.3f}, {r[-1]:.3f}]"
print(f"{mode} 8x128 layers={layers} rounds={rounds}: " + "  ".join(f"{k} {statistics.median(v)*1e3:.0f} ms" for k, v in t.items())
      + f"  now/before {ratio('now', 'before')}  speedup vs hf: before {ratio('hf', 'before')}  now {ratio('hf', 'now')}",
      flush=True)
