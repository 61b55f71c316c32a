"""Where BERT-base inference time goes on one thread, in thread CPU time (usable on a loaded machine), interleaved
rounds, medians and the [20 %, 80 %] spread of the per-round ratios.
  ops ROUNDS [ROWS,...]: per op of one layer at 8 x 128 (1,024 rows, or each ROWS given): the four GEMMs through
      MKL's plain sgemm (addmm, and addmm_ into a residual) and oneDNN's packed weight (fastenc.layers.prepack),
      with oneDNN's gelu / sum post-ops beside fastenc's separate pass; fastenc's attention kernel reading q, k, v
      in place from the QKV output beside torch SDPA on (8, 12, 128, 64); GELU and LayerNorm beside torch's.
  model ROUNDS fixed|varlen|b16|b128 [bert|electra|xlmr]: the whole forward (inference_mode) of fastenc, of
      fastenc with packing off (FASTENC_PREPACK=0's path: MKL's plain sgemm at every row count, the few-row
      GEMM's panels off too) and of
      transformers sdpa; random weights, seed 0; varlen: 16 sequences, lengths U[16, 384] seed 0.
Usage: OMP_NUM_THREADS=1 python bench/bert_infer_1t.py ops 15 | model 12 fixed"""
import copy, statistics, sys, time
import torch, torch.nn.functional as F
import transformers as tf, fastenc
from fastenc import extension
from fastenc.layers import prepack
from fastenc.benchmark.models import text_batch
from fastenc.benchmark.kernels import varlen_lengths
torch.set_num_threads(1)


def spread(v):
    v = sorted(v); return f"{statistics.median(v):.3f} [{v[len(v) // 5]:.3f}, {v[(4 * len(v)) // 5]:.3f}]"


def interleave(cases, rounds, reps=1):
    for f in cases.values(): f(); f()
    t = {c: [] for c in cases}
    for _ in range(rounds):
        for c, f in cases.items():
            t0 = time.thread_time()
            for _ in range(reps): f()
            t[c].append((time.thread_time() - t0) / reps * 1e3)
    return t


def ops(rounds, rows):
    ext, cases, flops = extension.load(), {}, {}
    torch.manual_seed(0)
    for m in rows:
        for name, (k, n) in {"qkv": (768, 2304), "wo": (768, 768), "fc1": (768, 3072), "fc2": (3072, 768)}.items():
            x, w, b, res = torch.randn(m, k), torch.randn(n, k) * 0.02, torch.randn(n) * 0.02, torch.randn(m, n)
            out, wt, pk = torch.empty(m, n), w.t(), torch.ops.mkldnn._reorder_linear_weight(w, None)
            key = f"{m}x{k}x{n} {name}"
            cases[f"{key} mkl addmm"] = lambda b=b, x=x, wt=wt, out=out: torch.addmm(b, x, wt, out=out)
            cases[f"{key} mkl addmm_ residual"] = lambda x=x, wt=wt, res=res: res.addmm_(x, wt)
            cases[f"{key} onednn packed"] = lambda x=x, pk=pk, b=b: prepack.linear(x, pk, b)
            if name == "fc1":
                cases[f"{key} onednn packed + gelu post-op"] = lambda x=x, pk=pk, b=b: torch.ops.mkldnn._linear_pointwise(
                    x, pk, b, "gelu", [], "none")
                def packed_then_gelu(x=x, pk=pk, b=b):
                    h = prepack.linear(x, pk, None); ext.gelu_out(h, b, "none", h)
                cases[f"{key} onednn packed, then fastenc gelu(+bias)"] = packed_then_gelu
            if name in ("wo", "fc2"):
                cases[f"{key} onednn packed + sum post-op"] = lambda x=x, pk=pk, b=b, res=res: (
                    torch.ops.mkldnn._linear_pointwise.binary(x, res, pk, b, "add"))
            for c in cases:
                flops.setdefault(c, 2 * m * k * n)
    bsz, heads, seq, d = 8, 12, 128, 64
    qkv = torch.randn(bsz * seq, 3 * heads * d)
    q, k, v = qkv.view(bsz * seq, 3, heads, d).unbind(1)
    cu = torch.arange(0, bsz * seq + 1, seq, dtype=torch.int32)
    qs, ks, vs = (torch.randn(bsz, heads, seq, d) for _ in range(3))
    h, hb = torch.randn(bsz * seq, 3072), torch.randn(3072)
    x, g, b, ib = (torch.randn(bsz * seq, 768),) + tuple(torch.randn(768) for _ in range(3))
    cases.update({
        "attention fastenc (q, k, v in the QKV output)": lambda: ext.attention(q, k, v, cu, seq, -1, -1, d ** -0.5),
        "attention torch sdpa (8, 12, 128, 64)": lambda: F.scaled_dot_product_attention(qs, ks, vs),
        "gelu fastenc (+bias, in place) 1024x3072": lambda: ext.gelu_out(h, hb, "none", h),
        "gelu torch 1024x3072": lambda: F.gelu(h),
        "layer_norm fastenc (+input bias) 1024x768": lambda: ext.layer_norm(x, g, b, None, ib, 1e-12, False, False),
        "layer_norm torch 1024x768": lambda: F.layer_norm(x, (768,), g, b, 1e-12),
    })
    flops.update({c: 4 * bsz * heads * seq * seq * d for c in cases if c.startswith("attention")})
    t = interleave(cases, rounds)
    print(f"ops: 1 thread, thread CPU time, {rounds} interleaved rounds: median ms [20 %, 80 %]")
    for c, v in t.items():
        rate = f"  {flops[c] / statistics.median(v) / 1e6:6.1f} GFLOP/s" if c in flops else ""
        print(f"  {c:52s} {spread(v)}{rate}")


def model(rounds, workload, arch):
    torch.manual_seed(0)
    if arch == "bert":
        hf = tf.BertModel(tf.BertConfig(), add_pooling_layer=False)
    elif arch == "electra":
        hf = tf.ElectraModel(tf.ElectraConfig(embedding_size=768, hidden_size=768, num_attention_heads=12,
                                              intermediate_size=3072))
    else:
        hf = tf.XLMRobertaModel(tf.XLMRobertaConfig(), add_pooling_layer=False)
    hf = hf.eval(); hf.set_attn_implementation("sdpa")
    lens = {"fixed": [128] * 8, "varlen": varlen_lengths(), "b16": [16], "b128": [128]}[workload]
    inputs = text_batch(lens, hf.config.vocab_size)
    fe = fastenc.from_hf(copy.deepcopy(hf)).eval()
    prepack._enabled()

    def call(m, packing=True):
        def run():
            prepack._ENABLED[:] = [packing]
            try:
                with torch.inference_mode():
                    return m(**inputs)
            finally:
                prepack._ENABLED[:] = [True]
        return run
    cases = {"fastenc": call(fe), "fastenc, packing off": call(fe, False), "hf-sdpa": call(hf)}
    t = interleave(cases, rounds, {"b16": 100, "b128": 10}.get(workload, 1))
    print(f"{arch} {workload} ({sum(lens)} tokens): 1 thread, thread CPU time, {rounds} interleaved rounds")
    for c, v in t.items():
        print(f"  {c:22s} {spread(v)} ms   hf-sdpa/this {spread([a / b for a, b in zip(t['hf-sdpa'], v)])}")
    print(f"  packing off / on: {spread([a / b for a, b in zip(t['fastenc, packing off'], t['fastenc'])])}")


if __name__ == "__main__":
    if sys.argv[1] == "ops":
        ops(int(sys.argv[2]), [int(r) for r in sys.argv[3].split(",")] if len(sys.argv) > 3 else [1024])
    else:
        model(int(sys.argv[2]), sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else "bert")
