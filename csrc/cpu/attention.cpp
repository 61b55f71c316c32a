// Fused bidirectional attention on the CPU: FlashAttention-2's tiled online softmax (Dao, 2023) on packed
// variable-length sequences with an optional sliding window; fp32 math, OpenMP over (sequence, head, query block).
//
// Per work item (sequence, head, query rows i0..i0+BM) and per key tile j0..j0+BN, in base 2 (q pre-scaled by
// scale * log2 e, so e^(scale q.k) = 2^S):
//   S^T  = K Q^T                        (BN x BM: one row per key, one register lane per query)
//   S_ji = -inf where key j is outside the tile, the sequence or query i's window [i - left, i + right]
//   m'_i = max(m_i, max_j S_ji);  P_ji = 2^(S_ji - m'_i);  alpha_i = 2^(m_i - m'_i)
//   l_i  = alpha_i l_i + sum_j P_ji;  O_i = alpha_i O_i + sum_j P_ji v_j;  m_i = m'_i
// and out_i = O_i / l_i at the end. Both products run one register-blocked micro-kernel (a row of one operand
// broadcast against registers of the other). Working memory per thread: Q^T block, K, V, S tiles, O block.
// Dropout (p > 0, keep-mask Z of attention_dropout.h): l sums the undropped P, the product takes P * Z, and
//   out_i = O_i / l_i / (1 - p)     i.e.  out = (softmax * Z / (1 - p)) V.
// Distance bias (relative-position buckets / ALiBi as a per-distance lookup b of 2 L - 1 entries per head):
//   S_ji += b[i - j + L - 1] * log2 e   on the tile, before the window mask; never a (seq x seq) buffer.
// With per-token positions and/or DeBERTa's c2p / p2c (attention_relative.h) the tile gathers instead:
//   S_ji += (b[pos_i - pos_j + L - 1] + c2p[i, h, s] + p2c[j, h, s]) * log2 e,  s = slot[pos_i - pos_j + L - 1].
#include "attention.h"
#include "attention_dropout.h"
#include "attention_relative.h"
#include "attention_simd.h"
#include "buffer_cache.h"
#include "parallel.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(__AVX__)
#include <immintrin.h>
#endif

namespace fastenc_cpu {
namespace {
using namespace attn;

constexpr int64_t BM = 128;  // most query rows per work item: the register lanes of S^T
constexpr int64_t BN = 64;   // keys per tile
static_assert(BN <= kMaxTileKeys, "a tile's keys must fit for_c2p_tile's position buffer");
static_assert((BM / 2) % PW == 0, "query blocks (BM or BM / 2 rows) must be whole Q^T panels");
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;
constexpr float M_INIT = -1e30f;  // finite running max: 2^(S - m) and 2^(m - m') never see inf - inf

struct Work {
  float *qt, *st, *kp, *vp, *o, *m, *l, *alpha;
};

// One thread's buffers, carved from `p` (64-byte aligned pieces); returns the floats used when p is null.
// kp, vp hold an item's whole key range (span rows); the rest is per query block.
int64_t carve_work(float* p, int64_t D, int64_t Dp, int64_t span, Work* w) {
  const int64_t sizes[] = {D * BM, BN * BM, span * D, span * Dp, BM * Dp, BM, BM, BM};
  constexpr int n = sizeof(sizes) / sizeof(sizes[0]);
  float** dst[n] = {&w->qt, &w->st, &w->kp, &w->vp, &w->o, &w->m, &w->l, &w->alpha};
  int64_t total = 0;
  for (int i = 0; i < n; ++i) {
    if (p != nullptr) *dst[i] = p + total;
    total += (sizes[i] + 15) / 16 * 16;
  }
  return total;
}

// A work item: query rows [q0, q1) of one (sequence, head), processed in blocks of bm rows against keys
// [kb, ke). Sequences up to kWholeSeq tokens are one item whose K and V rows are packed once (read from memory
// once, not once per query block; 512 rows x 2 x 256 B stay in L2); longer ones are one item per query block
// whose K and V are packed a BN-row tile at a time, just before use, with the next tile prefetched.
struct Item {
  int64_t start, len, q0, q1, kb, ke, h;
};
constexpr int64_t kWholeSeq = 512;
constexpr int64_t kPrefetchRows = 8;  // rows ahead that the K/V packing loop prefetches

// Keys that query rows [a, b) of a sequence of `len` can see.
inline void key_range(int64_t a, int64_t b, int64_t len, int64_t wl, int64_t wr, int64_t* kb, int64_t* ke) {
  *kb = wl >= 0 ? std::max<int64_t>(0, a - wl) : 0;
  *ke = wr >= 0 ? std::min(len, b + wr) : len;
}

}  // namespace

int64_t bias_reach(int64_t bias_len, int64_t longest, const char* op) {
  if (bias_len <= 0 || bias_len % 2 == 0)
    throw std::invalid_argument(std::string(op) + ": the distance bias must have 2 L - 1 (odd) columns, got " +
                                std::to_string(bias_len));
  const int64_t reach = (bias_len + 1) / 2;
  if (longest > reach)
    throw std::invalid_argument(std::string(op) + ": the distance bias covers sequences up to " +
                                std::to_string(reach) + " tokens, cu_seqlens has one of " + std::to_string(longest));
  return reach;
}

void attention_fwd(const float* q, const float* k, const float* v, float* out, const int32_t* cu_seqlens,
                   int64_t batch, int64_t heads, int64_t head_dim, int64_t window_left, int64_t window_right,
                   float scale, int num_threads, float* lse, double dropout_p, int64_t seed, int64_t offset,
                   int64_t ld_in, const Relative* rel) {
  const Dropout drop(dropout_p, seed, offset);
  // ld: the row stride of out; ldi: of q, k and v (their rows may sit inside a wider buffer, e.g. one QKV GEMM's)
  const int64_t H = heads, D = head_dim, ld = H * D, ldi = ld_in > 0 ? ld_in : ld;
  const int64_t total = cu_seqlens[batch];
  const int64_t Dp = (D + VW - 1) / VW * VW;  // V and O rows padded to whole registers
  const float qscale = scale * LOG2E;

  // cu_seqlens is read once, here, into a private copy that is checked before any row is touched (later reads of
  // the tensor could see other values): starts >= 0, non-decreasing; the caller bounds the last by the rows.
  std::vector<int64_t> cu(batch + 1);
  int64_t longest = 0;
  for (int64_t b = 0; b <= batch; ++b) {
    cu[b] = cu_seqlens[b];
    if (cu[b] < 0 || (b > 0 && cu[b] < cu[b - 1]))
      throw std::invalid_argument("attention (cpu): cu_seqlens must be >= 0 and non-decreasing, got cu_seqlens[" +
                                  std::to_string(b) + "] = " + std::to_string(cu[b]));
    if (b > 0) longest = std::max(longest, cu[b] - cu[b - 1]);
  }
  // The relative terms in log2 units, checked against the lengths just read (the contiguous bias index
  // i - j + reach - 1 stays inside), positions and slots copied and checked.
  const RelTerms rt = prepare_relative(rel, H, total, longest, LOG2E, "attention (cpu)");
  const int64_t reach = rt.reach, bias_len = rt.lut_len;
  const bool gathered = rt.gathered();
  // A window side >= the longest sequence bounds nothing (and i + right can no longer overflow).
  const int64_t wl = window_left >= longest ? -1 : window_left;
  const int64_t wr = window_right >= longest ? -1 : window_right;

  // Query rows per block: a narrow window (ModernBERT's local layers: 64 each side) wastes less of every key
  // tile with 64 rows; otherwise 128 rows reuse each K, V tile more.
  const int64_t bm = (wl >= 0 && wr >= 0 && wl + wr < 256) ? BM / 2 : BM;
  // Work items: costliest sequences first so dynamic scheduling balances a varlen batch.
  std::vector<int64_t> order(batch);
  auto seq_cost = [&](int64_t b) {
    const int64_t len = cu[b + 1] - cu[b];
    const int64_t span = std::min(len, (wl < 0 || wr < 0) ? len : wl + wr + 1);
    return len * span;
  };
  for (int64_t b = 0; b < batch; ++b) order[b] = b;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return seq_cost(a) > seq_cost(b); });
  std::vector<Item> items;
  int64_t span = 1;
  int64_t fmas = 0;  // multiply-adds of S = Q K^T and O = P V over every item (the team threshold)
  for (int64_t b : order) {
    const int64_t start = cu[b], len = cu[b + 1] - cu[b];
    const int64_t step = len <= kWholeSeq ? std::max<int64_t>(len, 1) : bm;
    for (int64_t h = 0; h < H; ++h)
      for (int64_t q0 = 0; q0 < len; q0 += step) {
        Item it{start, len, q0, std::min(len, q0 + step), 0, 0, h};
        key_range(it.q0, it.q1, len, wl, wr, &it.kb, &it.ke);
        span = std::max(span, it.ke - it.kb <= kWholeSeq ? it.ke - it.kb : BN);
        fmas += 2 * (it.q1 - it.q0) * (it.ke - it.kb) * D;
        items.push_back(it);
      }
  }
  const int64_t n_items = (int64_t)items.size();
  if (n_items == 0) return;
  // Below kParallelMinAttnFmas one thread is done before a team would have started (parallel.h).
  const int nt = !worth_parallel(fmas, kParallelMinAttnFmas) ? 1 : num_threads > 0 ? num_threads : omp_get_max_threads();

  Work w0{};
  const int64_t per_thread = carve_work(nullptr, D, Dp, span, &w0);
  // From the buffer cache: the same size comes back every layer. Throws std::bad_alloc before the parallel region.
  float* mem = static_cast<float*>(cache_alloc((size_t)(per_thread * nt) * sizeof(float)));

#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    Work w{};
    carve_work(mem + per_thread * omp_get_thread_num(), D, Dp, span, &w);
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < n_items; ++it) {
      const Item& item = items[it];
      const int64_t h = item.h, len = item.len;

      // K and V rows copied contiguously (rows heads*D apart would crowd a few cache sets; V rows zero-padded
      // to Dp), prefetching a few rows ahead (these reads come from DRAM or L3): the item's whole key range
      // at once when it is short, else tile by tile below.
      const bool whole = item.ke - item.kb <= kWholeSeq;
      auto pack = [&](int64_t j0, int64_t nrows, float* kdst, float* vdst) {
        const float* kt = k + (item.start + j0) * ldi + h * D;
        const float* vt = v + (item.start + j0) * ldi + h * D;
        for (int64_t j = 0; j < nrows; ++j) {
          if (j + kPrefetchRows < nrows) {
            prefetch_rows(kt + (j + kPrefetchRows) * ldi, ldi, 1, D);
            prefetch_rows(vt + (j + kPrefetchRows) * ldi, ldi, 1, D);
          }
          copy_row(kdst + j * D, kt + j * ldi, D);
          copy_row(vdst + j * Dp, vt + j * ldi, D);
          if (Dp > D) std::fill(vdst + j * Dp + D, vdst + (j + 1) * Dp, 0.f);
        }
      };
      if (whole) pack(item.kb, item.ke - item.kb, w.kp, w.vp);
      if (it + nt < n_items) {  // the item this thread likely takes next: its first Q rows and K, V rows to L2
        const Item& nx = items[it + nt];
        prefetch_rows(q + (nx.start + nx.q0) * ldi + nx.h * D, ldi, std::min(bm, nx.q1 - nx.q0), D);
        const int64_t nn = std::min<int64_t>(2 * kPrefetchRows, nx.ke - nx.kb);
        prefetch_rows(k + (nx.start + nx.kb) * ldi + nx.h * D, ldi, nn, D);
        prefetch_rows(v + (nx.start + nx.kb) * ldi + nx.h * D, ldi, nn, D);
      }

      for (int64_t i0 = item.q0; i0 < item.q1; i0 += bm) {
        const int64_t rows = std::min(bm, item.q1 - i0);
        const int64_t qcols = (rows + VW - 1) / VW;  // query registers in use
        const int64_t lanes = qcols * VW;
        // Q^T block (D x bm), pre-scaled; query lanes past the sequence are zero (computed, never written).
        for (int64_t r0 = 0; r0 < rows; r0 += PW)
          transpose_scaled(q + (item.start + i0 + r0) * ldi + h * D, ldi, std::min(PW, rows - r0), D, qscale,
                           w.qt + r0 * D, PW);
        for (int64_t r = rows; r < lanes; ++r)
          for (int64_t d = 0; d < D; ++d) w.qt[r / PW * PW * D + d * PW + r % PW] = 0.f;
        std::fill(w.o, w.o + rows * Dp, 0.f);
        std::fill(w.m, w.m + bm, M_INIT);
        std::fill(w.l, w.l + bm, 0.f);
        alignas(64) uint32_t rkeys[BM];  // dropout row keys of the block's query lanes
        if (drop.on) drop.rows(h, item.start + i0, lanes, rkeys);
        int32_t qpos[BM];  // the block's query positions (gathered relative terms)
        bool qrun = false;  // consecutive positions
        if (gathered) {
          for (int64_t r = 0; r < rows; ++r) qpos[r] = rt.position(item.start, i0 + r);
          qrun = consecutive(qpos, rows);
        }

        // Keys any row of the block can see: the sequence cut to the union of the rows' windows.
        int64_t kb, ke;
        key_range(i0, i0 + rows, len, wl, wr, &kb, &ke);
        for (int64_t j0 = kb; j0 < ke; j0 += BN) {
          const int64_t nk = std::min(BN, ke - j0);
          const float* kp = w.kp + (whole ? (j0 - item.kb) * D : 0);
          const float* vp = w.vp + (whole ? (j0 - item.kb) * Dp : 0);
          if (!whole) {
            pack(j0, nk, w.kp, w.vp);
            if (j0 + BN < ke) {  // the next tile's rows arrive while this one is computed
              const int64_t nn = std::min(BN, ke - j0 - BN);
              prefetch_rows(k + (item.start + j0 + BN) * ldi + h * D, ldi, nn, D);
              prefetch_rows(v + (item.start + j0 + BN) * ldi + h * D, ldi, nn, D);
            }
          }

          // S^T = K Q^T (log2 units): one row per key, one lane per query.
          product<false>({kp, D, 1, w.qt, PW, D, w.st, bm, nullptr, PW * D}, nk, qcols);
          // Distance bias: row j (key j0 + j) of S^T gets b[i0 + r - j0 - j + reach - 1] on lanes r < rows.
          if (reach > 0 && !gathered)
            for (int64_t j = 0; j < nk; ++j)
              add_row(w.st + j * bm, rt.bias2.data() + h * bias_len + (i0 - j0 - j) + reach - 1, rows);
          if (gathered)  // positions / c2p / p2c: gathered per lane
            for (int64_t j = 0; j < nk; ++j)
              add_relative_row(w.st + j * bm, rows, qpos, qrun, rt.position(item.start, j0 + j), h, item.start + i0,
                               item.start + j0 + j, rt);

          // Window: key ja is seen by queries ia in [ja - right, ja + left]: one lane range per key row.
          const bool masked = (wl >= 0 && j0 < i0 + rows - 1 - wl) || (wr >= 0 && j0 + nk - 1 > i0 + wr);
          if (masked) {
            for (int64_t j = 0; j < nk; ++j) {
              const int64_t ja = j0 + j;
              int64_t lo = wr >= 0 ? ja - wr - i0 : 0;
              int64_t hi = wl >= 0 ? ja + wl + 1 - i0 : lanes;
              lo = std::clamp<int64_t>(lo, 0, lanes);
              hi = std::clamp<int64_t>(hi, lo, lanes);
              std::fill(w.st + j * bm, w.st + j * bm + lo, -INFINITY);
              std::fill(w.st + j * bm + hi, w.st + j * bm + lanes, -INFINITY);
            }
          }

          // Online softmax, one lane per query: m' = max(m, max_j S), P = 2^(S - m'), l = alpha l + sum_j P.
          for (int64_t c = 0; c < qcols; ++c) {
            float* st = w.st + c * VW;
            vf mx = vset(-INFINITY), mx1 = mx;  // two chains: vmax latency, not throughput, bounds one
            int64_t j = 0;
            for (; j + 2 <= nk; j += 2) {
              mx = vmax(mx, vload(st + j * bm));
              mx1 = vmax(mx1, vload(st + (j + 1) * bm));
            }
            if (j < nk) mx = vmax(mx, vload(st + j * bm));
            mx = vmax(mx, mx1);
            const vf m_old = vload(w.m + c * VW);
            const vf m_new = vmax(m_old, mx);
            const vf a = vexp2(m_old - m_new);
            vf sum = vf{};
            if (!drop.on) {
              for (int64_t j = 0; j < nk; ++j) {
                const vf p = vexp2(vload(st + j * bm) - m_new);
                vstore(st + j * bm, p);
                sum += p;
              }
            } else {  // l sums every P; the product gets P * Z
              vu rk;
              std::memcpy(&rk, rkeys + c * VW, sizeof(vu));
              for (int64_t j = 0; j < nk; ++j) {
                const vf p = vexp2(vload(st + j * bm) - m_new);
                vstore(st + j * bm, drop.apply(p, rk, j0 + j));
                sum += p;
              }
            }
            vstore(w.m + c * VW, m_new);
            vstore(w.l + c * VW, vload(w.l + c * VW) * a + sum);
            vstore(w.alpha + c * VW, a);
          }

          // O = alpha O + P V: one row per query, registers along the features.
          product<true>({w.st, 1, bm, vp, Dp, nk, w.o, Dp, w.alpha, 0}, rows, Dp / VW);
        }

        float* ob = out + (item.start + i0) * ld + h * D;
        for (int64_t r = 0; r < rows; ++r) {
          const float inv = w.l[r] > 0.f ? drop.keep_scale / w.l[r] : 0.f;
          for (int64_t d = 0; d < D; ++d) ob[r * ld + d] = w.o[r * Dp + d] * inv;
        }
        if (lse != nullptr) {  // natural log-sum-exp of the row's scaled scores: (m + log2 l) ln 2; +inf if no key
          float* lrow = lse + h * total + item.start + i0;
          for (int64_t r = 0; r < rows; ++r)
            lrow[r] = w.l[r] > 0.f ? (w.m[r] + std::log2(w.l[r])) * LN2 : INFINITY;
        }
      }
    }
  }
  cache_free(mem);
}

}  // namespace fastenc_cpu
