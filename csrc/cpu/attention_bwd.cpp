// Backward of the CPU attention (csrc/cpu/attention.cpp): FlashAttention-2's backward (Dao, 2023) on packed
// variable-length sequences with an optional sliding window; fp32 math, OpenMP over (sequence, head).
//
// The probabilities are recomputed tile by tile from the forward's log-sum-exp (never stored). In base 2 (Q^T
// pre-scaled by scale * log2 e, lse2 = lse * log2 e), per work item (sequence, head):
//   D_i   = sum_d dO_id O_id                             (once per query row)
//   for each key tile j0..j0+BN:                         dK, dV accumulate in registers-sized tiles
//     for each query block i0..i0+BM that sees the tile (the window's band):
//       S^T  = K Q^T;  P^T_ji = 2^(S^T_ji - lse2_i)    (0 outside the window / sequence)
//       dV_j += sum_i P^T_ji dO_i                        (P^T dO)
//       dP^T = V dO^T;  dS^T_ji = P^T_ji (dP^T_ji - D_i)
//       dK_j += sum_i dS^T_ji Q_i                        (dS^T Q)
//       dQ_i += sum_j dS^T_ji K_j                        (dS K; the item owns its rows of dQ: no atomics)
//   dK *= scale, dQ *= scale at the end.
// Five products of (BN x BM x D) per tile pair, 2.5x the forward's two, all on the forward's micro-kernel
// (attention_simd.h). Working memory per thread: the item's Q^T and dO^T panels, Q, dO rows and the dQ
// accumulator (linear in the sequence length) plus O(BN x BM) tiles; no (seq x seq) buffer.
// Dropout (p > 0): the keep-mask Z (attention_dropout.h) is regenerated per tile, with Pd = P * Z / (1 - p):
//   dV_j += sum_i Pd^T_ji dO_i;   dS^T = P^T * (dP^T * Z/(1-p) - D) = Pd^T * dP^T - P^T * D
// (D = rowsum(dO * O) is unchanged: sum_j P_ij dP_ij Z_ij/(1-p) = dO_i . O_i). Gradients not asked for skip their
// products: no dq: the dQ product; no dk, dv: the dV and dK products.
// Distance bias (lookup b, 2 L - 1 entries per head): S^T_ji += b[i - j + L - 1] log2 e before the mask, as the
// forward; its gradient db[d] = sum_{i - j = d} dS_ij is accumulated per item (sequence, head) into that item's own
// slice (2 len - 1 entries: no sharing between threads) and the slices are summed in sequence order at the end, so
// the result does not depend on the thread count or the schedule.
// With per-token positions or DeBERTa's c2p / p2c (attention_relative.h) the tile gathers as the forward, and
//   db[pos_i - pos_j] += dS_ij (the item's slice then spans the whole lookup), dc2p[i, h, s] += dS_ij,
//   dp2c[j, h, s] += dS_ij   (s = the pair's slot)
// straight into the outputs: an item owns rows i and j of its (sequence, head), so again no sharing and a fixed
// order whatever the thread count.
#include "attention.h"
#include "attention_dropout.h"
#include "attention_relative.h"
#include "attention_simd.h"
#include "buffer_cache.h"
#include "parallel.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace fastenc_cpu {
namespace {
using namespace attn;

constexpr int64_t BM = 128;  // query lanes per block (a whole number of Q^T panels)
constexpr int64_t BN = 64;   // keys per tile
static_assert(BN <= kMaxTileKeys, "a tile's keys must fit for_c2p_tile's position buffer");
static_assert(BM % PW == 0, "query blocks must be whole Q^T panels");
constexpr float LOG2E = 1.4426950408889634f;

struct BwdWork {
  float *qt, *gt, *qr, *gr, *dqa, *lse2, *delta, *rkeys, *qpos;  // per item: (len rounded up to panels) x D / Dp, len
  float *kp, *vp, *dka, *dva, *st, *dst, *ones, *pdt;     // per key tile (pdt: Pd^T, with dropout only)
};

// One thread's buffers carved from p (64-byte aligned pieces); returns the floats used when p is null.
int64_t carve_bwd(float* p, int64_t D, int64_t Dp, int64_t lanes, bool dropout, bool gathered, BwdWork* w) {
  const int64_t sizes[] = {lanes * D, lanes * D, lanes * Dp, lanes * Dp, lanes * Dp, lanes, lanes,
                           dropout ? lanes : 0, gathered ? lanes : 0, BN * Dp, BN * Dp, BN * Dp, BN * Dp, BN * BM,
                           BN * BM, std::max(BN, BM), dropout ? BN * BM : 0};
  constexpr int n = sizeof(sizes) / sizeof(sizes[0]);
  float** dst[n] = {&w->qt, &w->gt, &w->qr, &w->gr, &w->dqa, &w->lse2, &w->delta, &w->rkeys, &w->qpos,
                    &w->kp, &w->vp, &w->dka, &w->dva, &w->st, &w->dst, &w->ones, &w->pdt};
  int64_t total = 0;
  for (int i = 0; i < n; ++i) {
    if (p != nullptr) *dst[i] = p + total;
    total += (sizes[i] + 15) / 16 * 16;
  }
  return total;
}

// rows x D floats (rows ld apart) -> rows x Dp contiguous, zero-padded.
inline void pack_rows(const float* src, int64_t ld, int64_t rows, int64_t D, int64_t Dp, float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    copy_row(dst + r * Dp, src + r * ld, D);
    std::fill(dst + r * Dp + D, dst + (r + 1) * Dp, 0.f);
  }
}

// Q^T-style panels (PW lanes each, D x PW) of `len` rows scaled by s; lanes len..lanes zero.
inline void pack_panels(const float* src, int64_t ld, int64_t len, int64_t lanes, int64_t D, float s, float* dst) {
  for (int64_t r0 = 0; r0 < len; r0 += PW)
    transpose_scaled(src + r0 * ld, ld, std::min(PW, len - r0), D, s, dst + r0 * D, PW);
  for (int64_t r = len; r < lanes; ++r)
    for (int64_t d = 0; d < D; ++d) dst[r / PW * PW * D + d * PW + r % PW] = 0.f;
}

// dst[0:n] = src[0:n] * s in whole registers and a scalar tail.
inline void scale_row(float* __restrict dst, const float* __restrict src, int64_t n, float s) {
  const vf sv = vset(s);
  int64_t i = 0;
  for (; i + VW <= n; i += VW) vstore(dst + i, vload(src + i) * sv);
  for (; i < n; ++i) dst[i] = src[i] * s;
}

}  // namespace

void attention_bwd(const float* grad, const float* q, const float* k, const float* v, const float* out,
                   const float* lse, float* dq, float* dk, float* dv, const int32_t* cu_seqlens, int64_t batch,
                   int64_t heads, int64_t head_dim, int64_t window_left, int64_t window_right, float scale,
                   int num_threads, double dropout_p, int64_t seed, int64_t offset, int64_t ld_in,
                   int64_t ld_dout, const Relative* rel, const RelativeGrads* grads) {
  const Dropout drop(dropout_p, seed, offset);
  const bool need_dq = dq != nullptr, need_dkdv = dk != nullptr && dv != nullptr;
  // ld: the row stride of grad and out; ldi: of q, k, v; ldd: of dq, dk, dv (rows inside wider buffers, e.g. one
  // QKV GEMM's (tokens, 3 * hidden) output and its gradient).
  const int64_t H = heads, D = head_dim, ld = H * D, total = cu_seqlens[batch];
  const int64_t ldi = ld_in > 0 ? ld_in : ld, ldd = ld_dout > 0 ? ld_dout : ld;
  const int64_t Dp = (D + VW - 1) / VW * VW;
  const int64_t wl = window_left, wr = window_right;
  const float qscale = scale * LOG2E;

  // Items (sequence, head), costliest first for dynamic scheduling; empty sequences have none.
  auto len_of = [&](int64_t b) { return (int64_t)cu_seqlens[b + 1] - cu_seqlens[b]; };
  auto cost = [&](int64_t b) {
    const int64_t len = len_of(b);
    return len * std::min(len, (wl < 0 || wr < 0) ? len : wl + wr + 1);
  };
  std::vector<int64_t> seqs;
  int64_t max_lanes = PW;
  int64_t fmas = 0;  // multiply-adds per head of the recomputed S and the four products (the team threshold)
  for (int64_t b = 0; b < batch; ++b)
    if (len_of(b) > 0) {
      fmas += 5 * cost(b) * D;
      seqs.push_back(b);
      max_lanes = std::max(max_lanes, (len_of(b) + PW - 1) / PW * PW);
    }
  // The relative terms in log2 units, checked against the lengths (the contiguous bias index i - j + reach - 1
  // stays inside), and the per-(sequence, head) bias gradient slices: item (b, h) owns
  // part[h * nparts + poff[b] : + its slice], 2 len_b - 1 entries indexed i - j + len_b - 1, or with positions
  // the whole lookup indexed pos_i - pos_j + reach - 1.
  int64_t longest = 0;
  for (int64_t b : seqs) longest = std::max(longest, len_of(b));
  const RelTerms rt = prepare_relative(rel, H, total, longest, LOG2E, "attention_bwd (cpu)");
  const int64_t reach = rt.reach, bias_len = rt.lut_len;
  const bool gathered = rt.gathered(), by_pos = !rt.pos.empty();
  float* dbias = grads != nullptr && rt.has_bias() ? grads->dbias : nullptr;
  float* dc2p = grads != nullptr && rt.c2p != nullptr ? grads->dc2p : nullptr;
  float* dp2c = grads != nullptr && rt.p2c != nullptr ? grads->dp2c : nullptr;
  const bool need_db = dbias != nullptr;
  auto slice_len = [&](int64_t b) { return by_pos ? bias_len : 2 * len_of(b) - 1; };
  std::vector<int64_t> poff(batch, 0);
  int64_t nparts = 0;
  for (int64_t b : seqs) poff[b] = nparts, nparts += slice_len(b);
  std::vector<float> part(need_db ? H * nparts : 0);
  if (dbias != nullptr) std::fill(dbias, dbias + H * bias_len, 0.f);
  // dc2p / dp2c: each item zeroes its own rows (its sequence's tokens at its head) before accumulating into them;
  // every token belongs to one sequence of non-zero length, so all of both are written.
  std::stable_sort(seqs.begin(), seqs.end(), [&](int64_t a, int64_t b) { return cost(a) > cost(b); });
  const int64_t n_items = (int64_t)seqs.size() * H;
  if (n_items == 0) return;
  // Below kParallelMinAttnFmas one thread is done before a team would have started (parallel.h).
  const int nt = !worth_parallel(fmas * H, kParallelMinAttnFmas) ? 1
                 : num_threads > 0 ? num_threads : omp_get_max_threads();
  BwdWork w0{};
  const int64_t per_thread = carve_bwd(nullptr, D, Dp, max_lanes, drop.on, gathered, &w0);
  float* mem = static_cast<float*>(cache_alloc((size_t)(per_thread * nt) * sizeof(float)));

#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    BwdWork w{};
    carve_bwd(mem + per_thread * omp_get_thread_num(), D, Dp, max_lanes, drop.on, gathered, &w);
    std::fill(w.ones, w.ones + std::max(BN, BM), 1.f);
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < n_items; ++it) {
      const int64_t b = seqs[it / H], h = it % H;
      const int64_t start = cu_seqlens[b], len = len_of(b);
      const int64_t lanes = (len + PW - 1) / PW * PW;
      float* db = need_db ? part.data() + h * nparts + poff[b] : nullptr;  // this item's slice (see slice_len)
      if (db != nullptr) std::fill(db, db + slice_len(b), 0.f);
      for (float* g : {dc2p, dp2c})
        if (g != nullptr)
          for (int64_t i = 0; i < len; ++i) std::fill_n(g + ((start + i) * H + h) * rt.S, rt.S, 0.f);
      const int64_t db_off = by_pos ? reach - 1 : len - 1;  // + pos_i - pos_j: the slice's index
      const float* b2 = reach > 0 && !gathered ? rt.bias2.data() + h * bias_len + reach - 1 : nullptr;  // i - j
      int32_t* qpos = reinterpret_cast<int32_t*>(w.qpos);  // the item's query positions (gathered terms)
      if (gathered)
        for (int64_t i = 0; i < len; ++i) qpos[i] = rt.position(start, i);
      const int64_t off = start * ld + h * D, offi = start * ldi + h * D, offd = start * ldd + h * D;

      // Per item: Q^T (scaled to log2 units) and dO^T panels, Q and dO rows, lse2, D = rowsum(dO * O).
      pack_panels(q + offi, ldi, len, lanes, D, qscale, w.qt);
      pack_panels(grad + off, ld, len, lanes, D, 1.f, w.gt);
      if (need_dkdv) {  // rows for the dK and dV products only
        pack_rows(q + offi, ldi, len, D, Dp, w.qr);
        pack_rows(grad + off, ld, len, D, Dp, w.gr);
      }
      std::fill(w.dqa, w.dqa + len * Dp, 0.f);
      for (int64_t i = 0; i < len; ++i) {
        w.lse2[i] = lse[h * total + start + i] * LOG2E;  // +inf (a row without keys) gives P = 0
        const float* g = grad + off + i * ld;
        const float* o = out + off + i * ld;
        vf acc = vf{};
        int64_t d = 0;
        for (; d + VW <= D; d += VW) acc = vfma(vload(g + d), vload(o + d), acc);
        float s = hsum(acc);
        for (; d < D; ++d) s += g[d] * o[d];
        w.delta[i] = s;
      }
      std::fill(w.lse2 + len, w.lse2 + lanes, 0.f);  // lanes past the sequence: computed, never read back
      std::fill(w.delta + len, w.delta + lanes, 0.f);
      uint32_t* rkeys = reinterpret_cast<uint32_t*>(w.rkeys);  // dropout row keys of the item's query lanes
      if (drop.on) drop.rows(h, start, lanes, rkeys);

      for (int64_t j0 = 0; j0 < len; j0 += BN) {
        const int64_t nk = std::min(BN, len - j0);
        pack_rows(k + offi + j0 * ldi, ldi, nk, D, Dp, w.kp);
        pack_rows(v + offi + j0 * ldi, ldi, nk, D, Dp, w.vp);
        std::fill(w.dka, w.dka + nk * Dp, 0.f);
        std::fill(w.dva, w.dva + nk * Dp, 0.f);
        // Queries that see a key of this tile: j - right <= i <= j + left; blocks start on panel boundaries.
        int64_t qlo = wr >= 0 ? std::max<int64_t>(0, j0 - wr) : 0;
        const int64_t qhi = wl >= 0 ? std::min(len, j0 + nk + wl) : len;
        qlo = qlo / PW * PW;
        for (int64_t i0 = qlo; i0 < qhi; i0 += BM) {
          const int64_t rows = std::min(BM, qhi - i0);
          const int64_t qcols = (rows + VW - 1) / VW, nl = qcols * VW;
          const float* qtp = w.qt + i0 * D;  // panel i0 / PW (each PW * D floats)
          const float* gtp = w.gt + i0 * D;

          // S^T = K Q^T (log2 units), masked to -inf outside query i's window, then P^T = 2^(S^T - lse2).
          product<false>({w.kp, Dp, 1, qtp, PW, D, w.st, BM, nullptr, PW * D}, nk, qcols);
          if (b2 != nullptr)  // row j (key j0 + j) gets b[i0 + r - j0 - j] on lanes r < rows
            for (int64_t j = 0; j < nk; ++j) add_row(w.st + j * BM, b2 + (i0 - j0 - j), rows);
          const bool qrun = gathered && consecutive(qpos + i0, rows);
          if (gathered)  // positions / c2p / p2c: gathered per lane
            for (int64_t j = 0; j < nk; ++j)
              add_relative_row(w.st + j * BM, rows, qpos + i0, qrun, rt.position(start, j0 + j), h, start + i0,
                               start + j0 + j, rt);
          const bool masked = (wl >= 0 && j0 < i0 + rows - 1 - wl) || (wr >= 0 && j0 + nk - 1 > i0 + wr);
          if (masked) {
            for (int64_t j = 0; j < nk; ++j) {
              const int64_t ja = j0 + j;
              int64_t lo = wr >= 0 ? ja - wr - i0 : 0;
              int64_t hi = wl >= 0 ? ja + wl + 1 - i0 : nl;
              lo = std::clamp<int64_t>(lo, 0, nl);
              hi = std::clamp<int64_t>(hi, lo, nl);
              std::fill(w.st + j * BM, w.st + j * BM + lo, -INFINITY);
              std::fill(w.st + j * BM + hi, w.st + j * BM + nl, -INFINITY);
            }
          }
          for (int64_t c = 0; c < qcols; ++c) {
            const vf l2 = vload(w.lse2 + i0 + c * VW);
            for (int64_t j = 0; j < nk; ++j) {
              float* s = w.st + j * BM + c * VW;
              vstore(s, vexp2(vload(s) - l2));
            }
          }

          if (drop.on) {  // Pd^T = P^T * Z / (1 - p)
            const vf ks = vset(drop.keep_scale);
            for (int64_t c = 0; c < qcols; ++c) {
              vu rk;
              std::memcpy(&rk, rkeys + i0 + c * VW, sizeof(vu));
              for (int64_t j = 0; j < nk; ++j)
                vstore(w.pdt + j * BM + c * VW, drop.apply(vload(w.st + j * BM + c * VW) * ks, rk, j0 + j));
            }
          }

          // dV += P^T dO (Pd^T dO with dropout; one row per key, registers along the features).
          if (need_dkdv)
            product<true>({drop.on ? w.pdt : w.st, BM, 1, w.gr + i0 * Dp, Dp, rows, w.dva, Dp, w.ones, 0}, nk,
                          Dp / VW);
          // dP^T = V dO^T; dS^T = P^T (dP^T - D)  (dropout: Pd^T dP^T - P^T D).
          product<false>({w.vp, Dp, 1, gtp, PW, D, w.dst, BM, nullptr, PW * D}, nk, qcols);
          for (int64_t c = 0; c < qcols; ++c) {
            const vf dl = vload(w.delta + i0 + c * VW);
            if (!drop.on) {
              for (int64_t j = 0; j < nk; ++j) {
                float* ds = w.dst + j * BM + c * VW;
                vstore(ds, vload(w.st + j * BM + c * VW) * (vload(ds) - dl));
              }
            } else {
              for (int64_t j = 0; j < nk; ++j) {
                float* ds = w.dst + j * BM + c * VW;
                vstore(ds, vload(w.pdt + j * BM + c * VW) * vload(ds) - vload(w.st + j * BM + c * VW) * dl);
              }
            }
          }
          // dbias[i - j] += dS^T_ji over the block's rows (lanes >= rows are past the sequence).
          if (db != nullptr && !gathered)
            for (int64_t j = 0; j < nk; ++j) add_row(db + (i0 - j0 - j) + len - 1, w.dst + j * BM, rows);
          if (gathered && dc2p != nullptr)
            c2p_grad_tile(w.dst, BM, rows, nk, qpos + i0, h, start + i0, start, j0, rt, dc2p);
          if (gathered && (db != nullptr || dp2c != nullptr))
            for (int64_t j = 0; j < nk; ++j)
              relative_grad_row(w.dst + j * BM, rows, qpos + i0, qrun, rt.position(start, j0 + j), h, start + i0,
                                start + j0 + j, rt, db, db_off, nullptr, dp2c);
          // dK += dS^T Q;  dQ[i0 : i0 + rows] += dS K (one row per query).
          if (need_dkdv)
            product<true>({w.dst, BM, 1, w.qr + i0 * Dp, Dp, rows, w.dka, Dp, w.ones, 0}, nk, Dp / VW);
          if (need_dq)
            product<true>({w.dst, 1, BM, w.kp, Dp, nk, w.dqa + i0 * Dp, Dp, w.ones, 0}, rows, Dp / VW);
        }
        if (need_dkdv) {
          float* dkt = dk + offd + j0 * ldd;
          float* dvt = dv + offd + j0 * ldd;
          for (int64_t j = 0; j < nk; ++j) {
            scale_row(dkt + j * ldd, w.dka + j * Dp, D, scale);
            copy_row(dvt + j * ldd, w.dva + j * Dp, D);
          }
        }
      }
      if (need_dq) {
        float* dqt = dq + offd;
        for (int64_t i = 0; i < len; ++i) scale_row(dqt + i * ldd, w.dqa + i * Dp, D, scale);
      }
    }
  }
  cache_free(mem);
  // dbias: the items' slices summed in sequence order (fixed, whatever thread ran which item).
  if (need_db)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t b = 0; b < batch; ++b) {
        const int64_t len = len_of(b);
        if (len == 0) continue;
        if (by_pos)
          add_row(dbias + h * bias_len, part.data() + h * nparts + poff[b], bias_len);
        else
          add_row(dbias + h * bias_len + reach - len, part.data() + h * nparts + poff[b], 2 * len - 1);
      }
}

}  // namespace fastenc_cpu
