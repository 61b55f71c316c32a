"""The workloads of `fastenc bench attention-relative` (fastenc/benchmark/attention_relative.py): DeBERTa-v3's
attention step on both sides with the same weights, the fused op with and without relative terms, and the
2,048-token forward whose memory is measured. Sizes default to DeBERTa-v3-base; tests pass tiny ones.

DeBERTa, per side, what one layer's attention does per forward (transformers' DisentangledSelfAttention and its
encoder's get_rel_embedding; fastenc's DebertaV2Encoder._run and DisentangledAttention.attend_rel):
  transformers  rel = LayerNorm(rel_embeddings (2 * span, hidden));  DisentangledSelfAttention(x (batch, seq, hidden),
                mask (batch, 1, seq, seq), relative_pos (1, seq, seq), rel) -> (batch, seq, hidden)
  fastenc       span = reach(cfg, longest); rel = LayerNorm(rel_embeddings[middle 2 * span rows]);
                attend_rel(x (tokens, hidden), cu_seqlens, longest, positions, rel, span) -> (tokens, hidden)
Neither includes the output projection (transformers' DebertaV2SelfOutput, fastenc's Wo).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import torch
from torch import nn

from fastenc import ops, testing
from fastenc.benchmark.ops._common import HEADS, HIDDEN, varlen_lengths

GRAD_RTOL = 1e-4  # max |fastenc grad - transformers grad| / max |transformers grad|, per tensor (fp32 sums)
SEED = 0


@dataclass(frozen=True)
class Sizes:
    """DeBERTa-v3-base's attention (hidden 768, 12 heads, 256 position buckets, max_relative_positions 512), the
    varlen batch, the 8 x 128 batch of the bias costs and the memory sequence."""
    hidden: int = HIDDEN
    heads: int = HEADS
    position_buckets: int = 256
    max_relative_positions: int = 512
    lengths: tuple[int, ...] = tuple(varlen_lengths())
    bias_batch: int = 8
    bias_seq: int = 128
    memory_tokens: int = 2048

    def as_dict(self) -> dict:
        d = asdict(self)
        d["lengths"] = list(self.lengths)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Sizes":
        names = {f.name for f in fields(cls)}
        bad = sorted(set(d) - names)
        if bad:
            raise ValueError(f"Sizes: unknown field(s) {bad}; fields are {sorted(names)}")
        return cls(**{k: tuple(v) if k == "lengths" else v for k, v in d.items()})


def _hf_config(sizes: Sizes):
    """transformers' DebertaV2Config of DeBERTa-v3-base's attention at `sizes`, dropout off (one layer)."""
    import transformers

    return transformers.DebertaV2Config(
        hidden_size=sizes.hidden, num_attention_heads=sizes.heads, num_hidden_layers=1,
        intermediate_size=4 * sizes.hidden, vocab_size=128, max_position_embeddings=512, type_vocab_size=0,
        relative_attention=True, position_buckets=sizes.position_buckets,
        max_relative_positions=sizes.max_relative_positions, pos_att_type=["p2c", "c2p"], share_att_key=True,
        norm_rel_ebd="layer_norm", layer_norm_eps=1e-7, position_biased_input=False, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0)


def _fe_config(sizes: Sizes):
    from fastenc.models.deberta_v2_encoder import DebertaV2Config

    return DebertaV2Config.from_dict(_hf_config(sizes).to_dict())


def _randn(g: torch.Generator, *shape, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=g) * scale


class DebertaPair:
    """transformers' DisentangledSelfAttention and fastenc's DisentangledAttention with the same random weights, each
    with its own relative embeddings (2 * span, hidden) and their LayerNorm (copies: gradients stay apart)."""

    def __init__(self, sizes: Sizes, g: torch.Generator):
        from transformers.models.deberta_v2 import modeling_deberta_v2 as deb

        from fastenc.layers import LayerNorm
        from fastenc.models.deberta_v2_encoder import DisentangledAttention

        self.deb = deb
        hf_cfg = _hf_config(sizes)
        self.cfg = cfg = _fe_config(sizes)
        h = sizes.hidden
        self.hf = deb.DisentangledSelfAttention(hf_cfg).eval()
        projs = (self.hf.query_proj, self.hf.key_proj, self.hf.value_proj)
        with torch.no_grad():
            for lin in projs:
                lin.weight.copy_(_randn(g, h, h, scale=h ** -0.5))
                lin.bias.copy_(_randn(g, h, scale=0.02))
        self.hf_rel = nn.Parameter(_randn(g, 2 * cfg.rel_span, h))
        self.hf_norm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)  # transformers' DebertaV2Encoder.LayerNorm
        with torch.no_grad():
            self.hf_norm.weight.copy_(1 + _randn(g, h, scale=0.1))
            self.hf_norm.bias.copy_(_randn(g, h, scale=0.1))
        self.fe = DisentangledAttention(cfg).eval()
        self.fe_norm = LayerNorm(h, cfg.layer_norm_eps)
        with torch.no_grad():
            self.fe.Wqkv.weight.copy_(torch.cat([lin.weight for lin in projs]))
            self.fe.Wqkv.bias.copy_(torch.cat([lin.bias for lin in projs]))
            self.fe.Wo.weight.zero_()  # (not part of the step)
            self.fe_norm.weight.copy_(self.hf_norm.weight)
            self.fe_norm.bias.copy_(self.hf_norm.bias)
        self.fe_rel = nn.Parameter(self.hf_rel.detach().clone())
        self.hf_params = [p for lin in projs for p in (lin.weight, lin.bias)] + [
            self.hf_rel, self.hf_norm.weight, self.hf_norm.bias]
        self.fe_params = [self.fe.Wqkv.weight, self.fe.Wqkv.bias, self.fe_rel, self.fe_norm.weight, self.fe_norm.bias]

    def hf_inputs(self, x: torch.Tensor, mask: torch.Tensor):
        """(mask (batch, 1, seq, seq), relative_pos (1, seq, seq)) as transformers' DebertaV2Encoder builds them
        once per forward (get_attention_mask, get_rel_pos)."""
        deb, cfg = self.deb, self.cfg
        mask4 = deb.DebertaV2Encoder.get_attention_mask(None, mask.long())  # (it reads nothing of self)
        rel_pos = deb.build_relative_position(x, x, bucket_size=cfg.position_buckets, max_position=cfg.max_relative)
        return mask4, rel_pos

    def hf_forward(self, x, mask4, rel_pos) -> torch.Tensor:
        rel = self.hf_norm(self.hf_rel)
        return self.hf(x, mask4, relative_pos=rel_pos, rel_embeddings=rel)[0]

    def fastenc_forward(self, x, cu_seqlens, longest: int, positions) -> torch.Tensor:
        from fastenc.models.deberta_v2_encoder import reach

        span, full = reach(self.cfg, longest), self.cfg.rel_span
        rel = self.fe_norm(self.fe_rel[full - span:full + span])
        return self.fe.attend_rel(x, cu_seqlens, longest, positions, rel, span)[0]


def _packing(lengths):
    lens = torch.tensor(lengths)
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = lens.cumsum(0)
    longest = int(lens.max())
    mask = torch.arange(longest)[None, :] < lens[:, None]  # (batch, longest), True = real token
    positions = torch.cat([torch.arange(n) for n in lengths])  # each token's column (int64, as pack_text)
    return cu, longest, mask, positions


def _rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    scale = float(ref.abs().max()) or 1.0
    err = (ours.double() - ref.double()).abs().max()
    return float(err) / scale if torch.isfinite(ours).all() else float("inf")


class DebertaCase:
    """Target 1: fastenc_step / hf_step (forward + backward to the input and every parameter) on the varlen batch,
    and check() comparing outputs on real tokens (tolerance rule) and gradients."""

    def __init__(self, sizes: Sizes):
        g = torch.Generator().manual_seed(SEED)
        self.pair = pair = DebertaPair(sizes, g)
        cu, longest, mask, positions = _packing(sizes.lengths)
        self.tokens, self.padded_tokens = int(mask.sum()), mask.numel()
        x = _randn(g, *mask.shape, sizes.hidden)  # padded rows hold data too (transformers computes them)
        grad = _randn(g, *mask.shape, sizes.hidden) * mask[..., None]  # no gradient from padded rows
        self.mask = mask
        self.hf_x = x.clone().requires_grad_(True)
        self.fe_x = x[mask].clone().requires_grad_(True)
        self.hf_grad, self.fe_grad = grad, grad[mask].contiguous()
        mask4, rel_pos = pair.hf_inputs(x, mask)
        self.hf_call = lambda: pair.hf_forward(self.hf_x, mask4, rel_pos)
        self.fe_call = lambda: pair.fastenc_forward(self.fe_x, cu, longest, positions)
        from fastenc.models.deberta_v2_encoder import reach
        self.rel_span = reach(pair.cfg, longest)

    def _hf_grads(self, out):
        return torch.autograd.grad(out, [self.hf_x, *self.pair.hf_params], self.hf_grad)

    def _fe_grads(self, out):
        return torch.autograd.grad(out, [self.fe_x, *self.pair.fe_params], self.fe_grad)

    def hf_step(self):
        return self._hf_grads(self.hf_call())

    def fastenc_step(self):
        return self._fe_grads(self.fe_call())

    def check(self) -> dict:
        hf_out, fe_out = self.hf_call(), self.fe_call()
        hf_g, fe_g = self._hf_grads(hf_out), self._fe_grads(fe_out)
        ref = hf_out.detach()[self.mask]
        tol = testing.tolerance(ref, None, torch.float32)
        out_err = float((fe_out.detach().double() - ref.double()).abs().max())
        if not torch.isfinite(fe_out).all():
            out_err = float("inf")
        gx, gqw, gqb, gkw, gkb, gvw, gvb, grel, gnw, gnb = hf_g
        theirs = {"x": gx[self.mask], "Wqkv.weight": torch.cat([gqw, gkw, gvw]), "Wqkv.bias": torch.cat([gqb, gkb, gvb]),
                  "rel_embeddings": grel, "rel_norm.weight": gnw, "rel_norm.bias": gnb}
        errs = {k: _rel_err(ours, ref_g) for (k, ref_g), ours in zip(theirs.items(), fe_g)}
        worst = max(errs, key=errs.get)
        return {"out_max_err": out_err, "out_tolerance": tol, "out_scale": float(ref.abs().max()),
                "grad_rel_err": errs, "grad_max_rel_err": errs[worst], "grad_worst": worst, "grad_rtol": GRAD_RTOL,
                "ok": out_err <= tol and errs[worst] <= GRAD_RTOL}


def deberta_case(sizes: Sizes) -> DebertaCase:
    return DebertaCase(sizes)


class BiasCase:
    """Target 2: plain() and relative() run the same op on the same q, k, v (forward, or forward + backward to every
    input); check() holds relative() to the reference backend."""

    def __init__(self, sizes: Sizes, terms: str, backward: bool):
        from fastenc.models.deberta_v2_encoder import reach
        from fastenc.models.mpnet import MAX_DISTANCE, NUM_BUCKETS

        if terms not in ("mpnet", "deberta"):
            raise ValueError(f"BiasCase: terms must be 'mpnet' or 'deberta', got {terms!r}")
        g = torch.Generator().manual_seed(SEED)
        b, s, h = sizes.bias_batch, sizes.bias_seq, sizes.heads
        t, d = b * s, sizes.hidden // h
        cu = torch.arange(0, t + 1, s, dtype=torch.int32)
        qkv = _randn(g, t, 3 * sizes.hidden).requires_grad_(backward)
        self.grad = _randn(g, t, h, d)
        self.backward = backward
        packed = {"cu_seqlens": cu, "max_seqlen": s}
        if terms == "mpnet":  # as MPNetAttention.attend: its inference path on three planes, training on qkv
            table = _randn(g, NUM_BUCKETS, h, scale=0.5).requires_grad_(backward)
            rel = {"relative_bias": table, "relative_max_distance": MAX_DISTANCE}
            self.info = {"num_buckets": NUM_BUCKETS, "max_distance": MAX_DISTANCE}
            leaves = [qkv, table]
            if not backward:
                q, k, v = (u.contiguous() for u in qkv.view(t, 3, h, d).unbind(1))
                self._call = lambda backend, **kw: ops.attention(q, k, v, **packed, backend=backend, **kw)
                self.info["entry"] = "fastenc.ops.attention (q, k, v planes)"
            else:
                self._call = lambda backend, **kw: ops.attention_qkv(qkv, h, **packed, backend=backend, **kw)
                self.info["entry"] = "fastenc.ops.attention_qkv"
        else:  # as DisentangledAttention.attend_rel: attention_qkv, positions, c2p / p2c pre-scaled
            cfg = _fe_config(sizes)
            span = reach(cfg, s)
            c2p, p2c = (_randn(g, t, h, 2 * span, scale=0.5).requires_grad_(backward) for _ in range(2))
            rel = {"c2p": c2p, "p2c": p2c, "rel_span": span, "position_buckets": cfg.position_buckets,
                   "max_relative_positions": cfg.max_relative, "positions": torch.arange(s).repeat(b)}
            packed["scale"] = 1.0 / math.sqrt(d * cfg.scale_factor)
            self.info = {"rel_span": span, "slots": 2 * span, "entry": "fastenc.ops.attention_qkv"}
            leaves = [qkv, c2p, p2c]
            self._call = lambda backend, **kw: ops.attention_qkv(qkv, h, **packed, backend=backend, **kw)
        self.rel, self.leaves, self.plain_leaves = rel, leaves, [qkv]

    def _run(self, backend: str, relative: bool):
        out = self._call(backend, **(self.rel if relative else {}))
        if not self.backward:
            return (out,)
        return (out, *torch.autograd.grad(out, self.leaves if relative else self.plain_leaves, self.grad))

    def plain(self):
        return self._run("cpu", False)

    def relative(self):
        return self._run("cpu", True)

    def check(self) -> dict:
        ours, ref = self.relative(), self._run("reference", True)
        err = float((ours[0].detach().double() - ref[0].detach().double()).abs().max())
        tol = testing.tolerance(ref[0].detach(), None, torch.float32)
        grad_err = max((_rel_err(a, b) for a, b in zip(ours[1:], ref[1:])), default=0.0)
        return {"max_err": err, "tolerance": tol, "grad_max_rel_err": grad_err,
                "ok": err <= tol and grad_err <= GRAD_RTOL}


def bias_case(sizes: Sizes, terms: str, backward: bool) -> BiasCase:
    return BiasCase(sizes, terms, backward)


class MemoryCase:
    """Target 3: one sequence of sizes.memory_tokens through each side's attention forward (inference)."""

    def __init__(self, sizes: Sizes):
        g = torch.Generator().manual_seed(SEED)
        self.pair = pair = DebertaPair(sizes, g)
        for p in [*pair.hf_params, *pair.fe_params]:
            p.requires_grad_(False)
        self.sizes = sizes
        n = sizes.memory_tokens
        cu, longest, mask, positions = _packing([n])
        x = _randn(g, 1, n, sizes.hidden)
        mask4, rel_pos = pair.hf_inputs(x, mask)
        x_packed = x[0].contiguous()
        self.fastenc_forward = lambda: pair.fastenc_forward(x_packed, cu, longest, positions)
        self.hf_forward = lambda: pair.hf_forward(x, mask4, rel_pos)
        self.hf_prebuilt_mib = (mask4.numel() * mask4.element_size() + rel_pos.numel() * rel_pos.element_size()) / 2**20


def deberta_memory_case(sizes: Sizes) -> MemoryCase:
    return MemoryCase(sizes)


def memory_parts(case: MemoryCase) -> dict:
    """Sizes (MiB) that explain the two peaks: fastenc's qkv, the c2p + p2c of one head group (the heads one
    attention call takes in inference) and output; one (heads, seq, seq) fp32 score tensor of transformers; the
    mask and relative positions its encoder builds beforehand (not counted)."""
    from fastenc.models.deberta_v2_encoder import head_group, reach

    s, n, h = case.sizes, case.sizes.memory_tokens, case.sizes.hidden
    span = reach(case.pair.cfg, n)
    g = head_group(s.heads, h // s.heads, 2 * span, 2, n)
    mib = 4 / 2**20
    return {"qkv_mib": n * 3 * h * mib, "heads_per_call": g, "c2p_p2c_mib": 2 * n * g * 2 * span * mib,
            "c2p_p2c_all_heads_mib": 2 * n * s.heads * 2 * span * mib, "output_mib": n * h * mib,
            "score_matrix_mib": s.heads * n * n * mib, "rel_span": span,
            "transformers_prebuilt_mask_and_relative_pos_mib": case.hf_prebuilt_mib}
