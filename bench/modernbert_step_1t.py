"""ModernBERT sequence classification training step (forward + cross-entropy + backward + AdamW) on one thread, in
thread CPU time (usable on a loaded machine), the providers interleaved in one process: fastenc with the full last
layer (every token, then the first token pooled: "before"), fastenc as it runs (the last layer's Wo, MLP and norms
on the pooled rows only: "now") and transformers with sdpa. ModernBERT-base widths and vocabulary, random weights.
Usage: python bench/modernbert_step_1t.py LAYERS fixed|varlen ROUNDS   (fixed: 8 x 128; varlen: 16 sequences,
lengths uniform in [16, 384], seed 0). Prints medians and the paired speedups over transformers [min, max]."""
import sys, time, statistics, copy, torch, torch.nn.functional as F
import transformers as tf, fastenc
from fastenc.benchmark.models import text_batch
from fastenc.benchmark.kernels import varlen_lengths
torch.set_num_threads(1)
layers, wl, rounds = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
torch.manual_seed(0)
cfg = tf.ModernBertConfig(num_labels=2, num_hidden_layers=layers)
hf = tf.ModernBertForSequenceClassification(cfg); hf.set_attn_implementation("sdpa")
lens = [128] * 8 if wl == "fixed" else varlen_lengths()
inputs = text_batch(lens, cfg.vocab_size); labels = torch.randint(0, 2, (len(lens),))
fe = fastenc.from_hf(copy.deepcopy(hf)).train(); fe_old = fastenc.from_hf(copy.deepcopy(hf)).train(); hf.train()
def old_forward(ids, mask):
    x, batch = fe_old._encode(ids, mask)
    return fe_old.classify(batch.first_tokens(x))
def stepper(m, fwd):
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-4)
    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(fwd(), labels); loss.backward(); opt.step()
    return step
ids, mask = inputs["input_ids"], inputs["attention_mask"]
steps = {"before": stepper(fe_old, lambda: old_forward(ids, mask)), "now": stepper(fe, lambda: fe(ids, mask)),
         "hf": stepper(hf, lambda: hf(**inputs).logits)}
for s in steps.values(): s()
t = {k: [] for k in steps}
for _ in range(rounds):
    for k, s in steps.items():
        a = time.thread_time(); s(); t[k].append(time.thread_time() - a)
def ratio(a, b):
    r = sorted(x / y for x, y in zip(t[a], t[b])); return f"{statistics.median(r):.3f} [{r[0]:.3f}, {r[-1]:.3f}]"
print(f"{wl} layers={layers} rounds={rounds}: " + "  ".join(f"{k} {statistics.median(v)*1e3:.0f} ms" for k, v in t.items())
      + f"  speedup vs hf: before {ratio('hf', 'before')}  now {ratio('hf', 'now')}", flush=True)
