"""ModernBERT sequence classification training step (forward + cross-entropy + backward + AdamW) at 1 and 2
threads, 8 x 128 tokens, the providers interleaved in one process: fastenc with the first-rows gather's backward as
torch's index_select has it (index_add_) and RoPE on contiguous copies of q, k and their gradients ("before"),
fastenc as it runs ("now") and transformers with sdpa.
ModernBERT-base widths and vocabulary, LAYERS layers (4: both local and global layers occur), config dropouts,
train mode, random weights. 1 thread: thread CPU time (usable on a loaded machine); 2 threads: wall time.
Usage: python bench/modernbert_step_threads.py LAYERS ROUNDS [THREADS...]   (default threads: 1 2)
Prints per thread count the medians and the paired speedups over transformers (median [min, max]), and each
provider's 1 -> 2 thread wall speedup (median of the wall times)."""
import sys, time, statistics, copy, os, torch, torch.nn.functional as F
import transformers as tf, fastenc
from fastenc.benchmark.models import text_batch
from fastenc.models import modernbert
import importlib
rope_op = importlib.import_module("fastenc.ops.rope")  # (fastenc.ops.rope the name is the function)
layers, rounds = int(sys.argv[1]), int(sys.argv[2])
threads = [int(t) for t in sys.argv[3:]] or [1, 2]
torch.manual_seed(0)
cfg = tf.ModernBertConfig(num_labels=2, num_hidden_layers=layers)
hf = tf.ModernBertForSequenceClassification(cfg); hf.set_attn_implementation("sdpa")
inputs = text_batch([128] * 8, cfg.vocab_size); labels = torch.randint(0, 2, (8,))
fe = fastenc.from_hf(copy.deepcopy(hf)).train(); fe_old = fastenc.from_hf(copy.deepcopy(hf)).train(); hf.train()
gather, strided = modernbert._RowGather, rope_op._TOKEN_STRIDED


class _IndexSelect:  # the gather as it was: torch's index_select and its backward
    apply = staticmethod(lambda x, rows: x.index_select(0, rows))


def stepper(m, fwd, old=False):
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-4)
    def step():
        modernbert._RowGather = _IndexSelect if old else gather
        rope_op._TOKEN_STRIDED = () if old else strided
        try:
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(fwd(), labels); loss.backward(); opt.step()
        finally:
            modernbert._RowGather, rope_op._TOKEN_STRIDED = gather, strided
    return step


ids, mask = inputs["input_ids"], inputs["attention_mask"]
steps = {"before": stepper(fe_old, lambda: fe_old(ids, mask), old=True), "now": stepper(fe, lambda: fe(ids, mask)),
         "hf": stepper(hf, lambda: hf(**inputs).logits)}
walls = {}
for th in threads:
    torch.set_num_threads(th)
    for s in steps.values(): s()
    t = {k: [] for k in steps}; w = {k: [] for k in steps}
    for _ in range(rounds):
        for k, s in steps.items():
            a, b = time.thread_time(), time.perf_counter(); s()
            t[k].append(time.thread_time() - a); w[k].append(time.perf_counter() - b)
    use = t if th == 1 else w
    walls[th] = {k: statistics.median(v) for k, v in w.items()}
    def ratio(a, b):
        r = sorted(x / y for x, y in zip(use[a], use[b])); return f"{statistics.median(r):.3f} [{r[0]:.3f}, {r[-1]:.3f}]"
    print(f"threads={th} ({'thread CPU' if th == 1 else 'wall'}) layers={layers} rounds={rounds} load={os.getloadavg()[0]:.1f}: "
          + "  ".join(f"{k} {statistics.median(v)*1e3:.0f} ms" for k, v in use.items())
          + f"  speedup vs hf: before {ratio('hf', 'before')}  now {ratio('hf', 'now')}", flush=True)
if 1 in walls and 2 in walls:
    print("1 -> 2 thread wall speedup: " + "  ".join(f"{k} {walls[1][k] / walls[2][k]:.2f}" for k in steps))
