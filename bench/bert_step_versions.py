"""BERT sequence classification training step (forward + cross-entropy + backward + AdamW, the config's dropouts,
BERT-base widths, random weights, 8 x 128) of two fastenc source trees and transformers (sdpa, + PEFT for LoRA),
paired: each runs in a process of its own (two trees cannot register the same fastenc:: ops in one), kept alive
and stepped in turn, one step each per round, so every round's times are taken side by side. Wall time and the
main thread's CPU time; THREADS torch threads each.
Usage: python bench/bert_step_versions.py full|lora ROUNDS LAYERS THREADS NAME=TREE ... (TREE: a checkout's root,
put first on PYTHONPATH with its own FASTENC_EXT_DIR under /tmp; or `hf` for transformers). Prints each round's
times, then medians and the paired ratios median [min, max]."""
import itertools, os, statistics, subprocess, sys, time


def worker(kind: str, mode: str, layers: int, threads: int) -> None:
    import torch, torch.nn.functional as F, transformers as tf
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    hf = tf.BertForSequenceClassification(tf.BertConfig(num_labels=2, num_hidden_layers=layers))
    hf.set_attn_implementation("sdpa")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, hf.config.vocab_size, (8, 128), generator=g)
    mask, labels = torch.ones(8, 128, dtype=torch.long), torch.randint(0, 2, (8,), generator=g)
    if kind == "hf":
        m = hf
        if mode == "lora":
            from peft import LoraConfig, get_peft_model
            m = get_peft_model(hf, LoraConfig(task_type="SEQ_CLS", r=8, lora_alpha=16, lora_dropout=0.1,
                                              target_modules=["query", "value"]))
        fwd = lambda: m(input_ids=ids, attention_mask=mask).logits
    else:
        import fastenc
        m = fastenc.from_hf(hf)
        if mode == "lora":
            m.add_lora(r=8, lora_alpha=16, target_modules=["query", "value"], lora_dropout=0.1)
        fwd = lambda: m(ids, mask)
    m.train()
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-4)  # the same on every side

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(fwd(), labels).backward()
        opt.step()
    step(); step()
    print("ready", flush=True)
    for _ in sys.stdin:
        a, c = time.perf_counter(), time.thread_time()
        step()
        print(f"{time.perf_counter() - a:.4f} {time.thread_time() - c:.4f}", flush=True)


def main() -> None:
    mode, rounds, layers, threads = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    procs = {}
    for spec in sys.argv[5:]:
        name, tree = spec.split("=", 1)
        env = dict(os.environ)
        if tree != "hf":
            env["PYTHONPATH"], env["FASTENC_EXT_DIR"] = os.path.abspath(tree), f"/tmp/fastenc-ext-{name}"
        procs[name] = subprocess.Popen([sys.executable, os.path.abspath(__file__), "worker", tree == "hf" and "hf" or
                                        "fastenc", mode, layers, threads], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, text=True, env=env, cwd="/tmp")
    for name, p in procs.items():
        if p.stdout.readline().strip() != "ready":
            sys.exit(f"{name}: the worker did not start")
    wall, cpu = {n: [] for n in procs}, {n: [] for n in procs}
    for r in range(rounds):
        for n in (list(procs) if r % 2 == 0 else list(procs)[::-1]):  # the order alternates round by round
            procs[n].stdin.write("step\n"); procs[n].stdin.flush()
            w, c = map(float, procs[n].stdout.readline().split())
            wall[n].append(w); cpu[n].append(c)
        print(f"round {r}: " + "  ".join(f"{n} {wall[n][-1] * 1e3:.0f} ms (cpu {cpu[n][-1] * 1e3:.0f})"
                                         for n in procs), flush=True)
    for p in procs.values():
        p.stdin.close(); p.wait()
    print(f"{mode} 8x128 layers={layers} threads={threads} rounds={rounds}: "
          + "  ".join(f"{n} {statistics.median(wall[n]) * 1e3:.0f} ms" for n in procs))
    for a, b in itertools.combinations(procs, 2):
        rw = sorted(x / y for x, y in zip(wall[a], wall[b]))
        rc = sorted(x / y for x, y in zip(cpu[a], cpu[b]))
        print(f"  {a}/{b}: wall {statistics.median(rw):.3f} [{rw[0]:.3f}, {rw[-1]:.3f}]  "
              f"thread cpu {statistics.median(rc):.3f} [{rc[0]:.3f}, {rc[-1]:.3f}]")


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    else:
        main()
