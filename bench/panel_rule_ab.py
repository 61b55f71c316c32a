"""Whole-model A/B of the panel GEMM's row rule, in one process, interleaved round by round: `new` (fastenc's panel
GEMM at every row count, prepack.use_panels) vs `old` (the panels up to 128 rows only, oneDNN's packed or the plain
GEMM above, the rule before f07cd1c), beside transformers sdpa. Prints medians (ms) and paired ratios, median
[20%, 80%].

  PYTHONPATH=. python bench/panel_rule_ab.py bert-base fixed,varlen 9
"""
import torch, time, copy, sys, statistics
torch.set_num_threads(2)
from fastenc.benchmark import models as M
from fastenc.layers import prepack
name=sys.argv[1]; wls=sys.argv[2].split(","); rounds=int(sys.argv[3])
spec=M.MODELS[name]; hf=spec.build().eval()
vocab=getattr(hf.config,"vocab_size",0)
fe=M._torch_fn(M.fastenc_model(copy.deepcopy(hf)).eval())
hs=M._torch_fn(copy.deepcopy(hf).eval())
NEW=prepack.use_panels
def OLD(x,w): return NEW(x,w) and x.shape[0] <= 128
def new(inp): prepack.use_panels=NEW; return fe(inp)
def old(inp): prepack.use_panels=OLD; return fe(inp)
for wl in wls:
    inputs=M.workloads(spec,vocab)[wl][0]
    fns={"new":new,"old":old,"hf":hs}
    for f in fns.values(): f(inputs)
    S={k:[] for k in fns}
    for r in range(rounds):
        for k,f in fns.items():
            a=time.perf_counter(); f(inputs); S[k].append(time.perf_counter()-a)
    med={k:statistics.median(v) for k,v in S.items()}
    def pr(a,b):
        q=sorted(x/y for x,y in zip(S[a],S[b])); return "%.3f [%.3f, %.3f]"%(statistics.median(q),q[len(q)//5],q[-1-len(q)//5])
    print(name,wl,{k:round(v*1e3,1) for k,v in med.items()}, "hf/new",pr("hf","new"),"hf/old",pr("hf","old"),"old/new",pr("old","new"),flush=True)
