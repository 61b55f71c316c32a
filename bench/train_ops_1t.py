"""Training-step ops at BERT-base / ModernBERT-base sizes (8 x 128 tokens), fp32, 1 thread, thread CPU time:
fastenc (public op incl. autograd; and the bare C++ kernel) beside torch (F.* + autograd; and the bare aten kernel),
interleaved, median of paired ratios [min, max], and the bytes each moves against this machine's copy rate.
Usage: python bench/train_ops_1t.py [ROUNDS]"""
import statistics, sys, time, torch, torch.nn.functional as F, fastenc
from fastenc import extension
torch.set_num_threads(1)
torch.manual_seed(0)
ext = extension.load()
R, H, I, N = 1024, 768, 3072, 1152
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 9
def tt(fn, reps=5):
    fn(); ts = []
    for _ in range(reps):
        t = time.thread_time(); fn(); ts.append(time.thread_time() - t)
    return min(ts)
big = torch.randn(16 * 2 ** 20); dst = torch.empty_like(big)
copy_gbs = max(2 * big.numel() * 4 / tt(lambda: dst.copy_(big)) / 1e9 for _ in range(3))
print(f"copy rate (1 thread): {copy_gbs:.1f} GB/s (read + write)")
def pair(name, nbytes, a, b):
    ra, rb, rr = [], [], []
    for _ in range(ROUNDS):
        x, y = tt(a), tt(b); ra.append(x); rb.append(y); rr.append(x / y)
    rr.sort(); fa, fb = statistics.median(ra), statistics.median(rb)
    floor = nbytes / copy_gbs / 1e9
    print(f"{name:34s} fastenc {fa*1e3:6.2f} ms  torch {fb*1e3:6.2f} ms  fastenc/torch {statistics.median(rr):.2f} "
          f"[{rr[0]:.2f}, {rr[-1]:.2f}]  floor {floor*1e3:5.2f} ms ({floor/fa:.0%} of it)", flush=True)
f4 = 4
x = torch.randn(R, H, requires_grad=True); r = torch.randn(R, H, requires_grad=True)
w = torch.randn(H, requires_grad=True); b = torch.randn(H, requires_grad=True); dy = torch.randn(R, H)
# --- LayerNorm (BERT: bias, post-norm with residual + input bias; ModernBERT: no bias, residual stream kept)
ib = torch.randn(H, requires_grad=True)
pair("LN fwd train (bias, res, in-bias)", 3 * R * H * f4 + R * H * f4,
     lambda: fastenc.ops.layer_norm(x, w, b, residual=r, input_bias=ib, return_residual=False),
     lambda: F.layer_norm(x + ib + r, (H,), w, b))
yf = fastenc.ops.layer_norm(x, w, b, residual=r, input_bias=ib, return_residual=False)
yt = F.layer_norm(x + ib + r, (H,), w, b)
pair("LN bwd (bias, res, in-bias)", 3 * R * H * f4,
     lambda: torch.autograd.grad(yf, (x, r, w, b, ib), dy, retain_graph=True),
     lambda: torch.autograd.grad(yt, (x, r, w, b, ib), dy, retain_graph=True))
yf2, hf2 = fastenc.ops.layer_norm(x, w, None, residual=r)
h2 = x + r; yt2 = F.layer_norm(h2, (H,), w, None)
dh = torch.randn(R, H)
pair("LN fwd train (no bias, res kept)", 4 * R * H * f4,
     lambda: fastenc.ops.layer_norm(x, w, None, residual=r), lambda: (lambda hh: (F.layer_norm(hh, (H,), w, None), hh))(x + r))
pair("LN bwd (no bias, res kept)", 4 * R * H * f4,
     lambda: torch.autograd.grad((yf2, hf2), (x, r, w), (dy, dh), retain_graph=True),
     lambda: torch.autograd.grad((yt2, h2), (x, r, w), (dy, dh), retain_graph=True))
with torch.no_grad():
    xd, wd, bd = x.detach(), w.detach(), b.detach()
    _, _, mean, rstd = ext.layer_norm(xd, wd, bd, None, None, 1e-5, False, True)
    pair("  kernel: LN fwd + stats", 2 * R * H * f4, lambda: ext.layer_norm(xd, wd, bd, None, None, 1e-5, False, True),
         lambda: torch.native_layer_norm(xd, (H,), wd, bd, 1e-5))
    pair("  kernel: LN bwd (dx, dw, db)", 3 * R * H * f4, lambda: ext.norm_bwd(dy, None, xd, wd, mean, rstd, True, True),
         lambda: torch.ops.aten.native_layer_norm_backward(dy, xd, (H,), mean.view(R, 1), rstd.view(R, 1), wd, bd,
                                                           [True, True, True]))
# --- GELU (BERT MLP: fc1 bias fused here; torch: addmm already added it)
g = torch.randn(R, I, requires_grad=True); gb = torch.randn(I, requires_grad=True); dg = torch.randn(R, I)
pair("GELU+bias fwd train", 2 * R * I * f4, lambda: fastenc.ops.gelu(g, gb), lambda: F.gelu(g))
of, ot = fastenc.ops.gelu(g, gb), F.gelu(g + gb)
pair("GELU+bias bwd (dx, dbias)", 3 * R * I * f4, lambda: torch.autograd.grad(of, (g, gb), dg, retain_graph=True),
     lambda: torch.autograd.grad(ot, (g, gb), dg, retain_graph=True))
with torch.no_grad():
    gd = g.detach()
    pair("  kernel: GELU fwd", 2 * R * I * f4, lambda: ext.gelu(gd, None, "none"), lambda: torch.ops.aten.gelu(gd))
# --- GeGLU (ModernBERT: Wi output (R, 2N) -> (R, N))
xg = torch.randn(R, 2 * N, requires_grad=True); dgg = torch.randn(R, N)
def geglu_t(v):
    a, gate = v.chunk(2, dim=-1); return F.gelu(a) * gate
pair("GeGLU fwd train", 3 * R * N * f4, lambda: fastenc.ops.geglu(xg), lambda: geglu_t(xg))
o1, o2 = fastenc.ops.geglu(xg), geglu_t(xg)
pair("GeGLU bwd", 5 * R * N * f4, lambda: torch.autograd.grad(o1, (xg,), dgg, retain_graph=True),
     lambda: torch.autograd.grad(o2, (xg,), dgg, retain_graph=True))
