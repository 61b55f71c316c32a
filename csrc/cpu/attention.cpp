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
#include "attention.h"
#include "buffer_cache.h"

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

// One SIMD register of floats as a GCC vector type (zmm with AVX-512, ymm with AVX/AVX2, xmm otherwise).
// Micro-tile: NR rows x NC registers (24 accumulators of the 32 zmm; 12 of the 16 ymm, 8 of the 16 xmm).
#if defined(__AVX512F__)
#define FASTENC_VW 16
#define FASTENC_NR 6
#define FASTENC_NC 4
#elif defined(__AVX__)
#define FASTENC_VW 8
#define FASTENC_NR 6
#define FASTENC_NC 2
#else
#define FASTENC_VW 4
#define FASTENC_NR 4
#define FASTENC_NC 2
#endif
constexpr int NR = FASTENC_NR, NC = FASTENC_NC;
constexpr int VW = FASTENC_VW;
// Q^T is stored as panels of PW queries (one micro-tile's register columns), each D x PW contiguous: the panel a
// micro-tile streams is 4 KiB in a row (AVX2) rather than D rows 512 B apart that share 8 of the 64 L1 sets.
constexpr int64_t PW = NC * VW;
typedef float vf __attribute__((vector_size(FASTENC_VW * 4)));
typedef int32_t vi __attribute__((vector_size(FASTENC_VW * 4)));

constexpr int64_t BM = 128;  // most query rows per work item: the register lanes of S^T
constexpr int64_t BN = 64;   // keys per tile
static_assert((BM / 2) % PW == 0, "query blocks (BM or BM / 2 rows) must be whole Q^T panels");
constexpr float LOG2E = 1.4426950408889634f;
constexpr float M_INIT = -1e30f;  // finite running max: 2^(S - m) and 2^(m - m') never see inf - inf

inline vf vload(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof(vf));
  return v;
}
inline void vstore(float* p, vf v) { std::memcpy(p, &v, sizeof(vf)); }
inline vf vset(float x) {  // broadcast (vf{} + x would cost an add: 0 + x is not x for x = -0)
#if defined(__AVX512F__)
  return _mm512_set1_ps(x);
#elif defined(__AVX__)
  return _mm256_set1_ps(x);
#else
  return vf{x, x, x, x};
#endif
}
inline vf vfma(vf a, vf b, vf c) {  // a * b + c in one rounding where the ISA has FMA
#if defined(__AVX512F__)
  return _mm512_fmadd_ps(a, b, c);
#elif defined(__FMA__)
  return _mm256_fmadd_ps(a, b, c);
#else
  return a * b + c;
#endif
}
inline vf vmax(vf a, vf b) { return a > b ? a : b; }
inline float hmax(vf a) {
  float m = a[0];
  for (int i = 1; i < VW; ++i) m = std::max(m, a[i]);
  return m;
}
inline float hsum(vf a) {
  float s = 0.f;
  for (int i = 0; i < VW; ++i) s += a[i];
  return s;
}

// 2^x for the softmax's x <= 0 (S - m' and m - m' are never positive): x = n + f with n = round(x),
// |f| <= 1/2; 2^f = e^(f ln2) by its degree-6 Taylor polynomial (truncation < 2e-7 relative); 2^n is written
// into the exponent bits. x <= -127 (including -inf) gives exactly 0; NaN stays NaN.
inline vf vexp2(vf x) {
#if defined(__AVX512F__)
  x = _mm512_max_ps(vset(-127.f), x);  // max(lo, x) returns x when x is NaN
#elif defined(__AVX__)
  x = _mm256_max_ps(vset(-127.f), x);
#else
  x = x < vset(-127.f) ? vset(-127.f) : x;
#endif
  const vf magic = vset(12582912.f);  // 1.5 * 2^23: adding and subtracting it rounds to the nearest integer
  const vf r = (x + magic) - magic;
  const vf f = x - r;
  vf p = vset(1.5403530393381606e-04f);
  p = vfma(p, f, vset(1.3333558146428443e-03f));
  p = vfma(p, f, vset(9.618129107628477e-03f));
  p = vfma(p, f, vset(5.550410866482158e-02f));
  p = vfma(p, f, vset(2.402265069591007e-01f));
  p = vfma(p, f, vset(6.931471805599453e-01f));
  p = vfma(p, f, vset(1.0f));
  const vi bits = (__builtin_convertvector(r, vi) + 127) << 23;  // n = -127 -> all-zero bits = 0.0f
  vf two_n;
  std::memcpy(&two_n, &bits, sizeof(vf));
  return p * two_n;
}

// Q^T block: qt[d * ldt + r] = src[r * ld + d] * s for r < rows, d < D (called once per panel). Strided scalar
// stores (or loads) keep hitting the same few L1 sets (rows 3 KiB apart): 15% of the kernel's time at 8 x 128 tokens
// before 8 x 8 blocks were transposed in registers (AVX), edges scalar.
inline void transpose_scaled(const float* src, int64_t ld, int64_t rows, int64_t D, float s, float* qt,
                             int64_t ldt) {
  int64_t r0 = 0;
#if defined(__AVX__)
  const __m256 sv = _mm256_set1_ps(s);
  for (; r0 + 8 <= rows; r0 += 8) {
    int64_t d0 = 0;
    for (; d0 + 8 <= D; d0 += 8) {
      __m256 a[8];
      for (int i = 0; i < 8; ++i) a[i] = _mm256_mul_ps(_mm256_loadu_ps(src + (r0 + i) * ld + d0), sv);
      __m256 t[8], u[8];
      for (int i = 0; i < 4; ++i) {
        t[2 * i] = _mm256_unpacklo_ps(a[2 * i], a[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(a[2 * i], a[2 * i + 1]);
      }
      for (int i = 0; i < 2; ++i) {
        u[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
      }
      for (int i = 0; i < 4; ++i) {
        _mm256_storeu_ps(qt + (d0 + i) * ldt + r0, _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
        _mm256_storeu_ps(qt + (d0 + i + 4) * ldt + r0, _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
      }
    }
    for (; d0 < D; ++d0)
      for (int64_t r = r0; r < r0 + 8; ++r) qt[d0 * ldt + r] = src[r * ld + d0] * s;
  }
#endif
  for (; r0 < rows; ++r0)
    for (int64_t d = 0; d < D; ++d) qt[d * ldt + r0] = src[r0 * ld + d] * s;
}

// dst[0:n] = src[0:n] in whole registers and a scalar tail (inline: a libc memmove call per 256-byte row costs
// more than the copy).
inline void copy_row(float* __restrict dst, const float* __restrict src, int64_t n) {
  int64_t i = 0;
  for (; i + VW <= n; i += VW) vstore(dst + i, vload(src + i));
  for (; i < n; ++i) dst[i] = src[i];
}

// Prefetch `rows` rows of n floats, ld apart, into L2.
inline void prefetch_rows(const float* p, int64_t ld, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t d = 0; d < n; d += 16) __builtin_prefetch(p + r * ld + d, 0, 2);
}

// The one micro-kernel, for both products:
//   Out[r][c0 + c regs] = (ACC ? alpha[r] Out[r] : 0) + sum_t A(r, t) * B[t][c regs],   r < R, c < C,
// A(r, t) = A[r * ars + t * ats] broadcast from memory; B (already at register column c0) rows ldb floats apart,
// Out rows ldo floats apart.
//   S^T = K Q^T:           A = K tile (ars = D, ats = 1),  B = a Q^T panel (ldb = PW), t = feature
//   O = alpha O + P V:     A = P^T   (ars = 1, ats = BM), B = V tile (ldb = Dp), t = key
template <int R, int C, bool ACC>
inline void micro(const float* A, int64_t ars, int64_t ats, const float* B, int64_t ldb, int64_t n, float* Out,
                  int64_t ldo, const float* alpha, int64_t c0) {
  vf acc[R][C];
  for (int r = 0; r < R; ++r) {
    if constexpr (ACC) {
      const vf a = vset(alpha[r]);
      for (int c = 0; c < C; ++c) acc[r][c] = vload(Out + r * ldo + (c0 + c) * VW) * a;
    } else {
      for (int c = 0; c < C; ++c) acc[r][c] = vf{};
    }
  }
  const float* bt = B;
  for (int64_t t = 0; t < n; ++t, bt += ldb, A += ats) {
    vf bv[C];
    for (int c = 0; c < C; ++c) bv[c] = vload(bt + c * VW);
    for (int r = 0; r < R; ++r) {
      const vf ab = vset(A[r * ars]);
      for (int c = 0; c < C; ++c) acc[r][c] = vfma(ab, bv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) vstore(Out + r * ldo + (c0 + c) * VW, acc[r][c]);
}

struct Operands {
  const float* A;
  int64_t ars, ats;
  const float* B;
  int64_t ldb, n;
  float* Out;
  int64_t ldo;
  const float* alpha;
  int64_t bpanel;  // 0: B is one matrix (register column c at B + c * VW); else floats between NC-register panels
};

// All `rows` rows of Out for register columns [c0, c0 + C): full NR-row tiles, then the remainder.
template <int C, bool ACC>
inline void micro_rows(const Operands& o, int64_t c0, int64_t rows) {
  const float* B = o.bpanel ? o.B + c0 / NC * o.bpanel : o.B + c0 * VW;
  int64_t r = 0;
  for (; r + NR <= rows; r += NR)
    micro<NR, C, ACC>(o.A + r * o.ars, o.ars, o.ats, B, o.ldb, o.n, o.Out + r * o.ldo, o.ldo,
                      ACC ? o.alpha + r : nullptr, c0);
  const float* a = o.A + r * o.ars;
  float* out = o.Out + r * o.ldo;
  const float* al = ACC ? o.alpha + r : nullptr;
  switch (rows - r) {
#if FASTENC_NR > 5
    case 5: micro<5, C, ACC>(a, o.ars, o.ats, B, o.ldb, o.n, out, o.ldo, al, c0); break;
    case 4: micro<4, C, ACC>(a, o.ars, o.ats, B, o.ldb, o.n, out, o.ldo, al, c0); break;
#endif
    case 3: micro<3, C, ACC>(a, o.ars, o.ats, B, o.ldb, o.n, out, o.ldo, al, c0); break;
    case 2: micro<2, C, ACC>(a, o.ars, o.ats, B, o.ldb, o.n, out, o.ldo, al, c0); break;
    case 1: micro<1, C, ACC>(a, o.ars, o.ats, B, o.ldb, o.n, out, o.ldo, al, c0); break;
    default: break;
  }
}

// Out[rows x cols registers]: register columns in groups of NC, the last group narrower.
template <bool ACC>
inline void product(const Operands& o, int64_t rows, int64_t cols) {
  for (int64_t c0 = 0; c0 < cols; c0 += NC) {
    switch (std::min<int64_t>(NC, cols - c0)) {
#if FASTENC_NC > 2
      case 4: micro_rows<4, ACC>(o, c0, rows); break;
      case 3: micro_rows<3, ACC>(o, c0, rows); break;
#endif
      case 2: micro_rows<2, ACC>(o, c0, rows); break;
      default: micro_rows<1, ACC>(o, c0, rows); break;
    }
  }
}

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

void attention_fwd(const float* q, const float* k, const float* v, float* out, const int32_t* cu_seqlens,
                   int64_t batch, int64_t heads, int64_t head_dim, int64_t window_left, int64_t window_right,
                   float scale, int num_threads) {
  const int64_t H = heads, D = head_dim, ld = H * D;
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
  for (int64_t b : order) {
    const int64_t start = cu[b], len = cu[b + 1] - cu[b];
    const int64_t step = len <= kWholeSeq ? std::max<int64_t>(len, 1) : bm;
    for (int64_t h = 0; h < H; ++h)
      for (int64_t q0 = 0; q0 < len; q0 += step) {
        Item it{start, len, q0, std::min(len, q0 + step), 0, 0, h};
        key_range(it.q0, it.q1, len, wl, wr, &it.kb, &it.ke);
        span = std::max(span, it.ke - it.kb <= kWholeSeq ? it.ke - it.kb : BN);
        items.push_back(it);
      }
  }
  const int64_t n_items = (int64_t)items.size();
  if (n_items == 0) return;
  const int nt = num_threads > 0 ? num_threads : omp_get_max_threads();

  Work w0{};
  const int64_t per_thread = carve_work(nullptr, D, Dp, span, &w0);
  // From the buffer cache: the same size comes back every layer. Throws std::bad_alloc before the parallel region.
  float* mem = static_cast<float*>(cache_alloc((size_t)(per_thread * nt) * sizeof(float)));

#pragma omp parallel num_threads(nt)
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
        const float* kt = k + (item.start + j0) * ld + h * D;
        const float* vt = v + (item.start + j0) * ld + h * D;
        for (int64_t j = 0; j < nrows; ++j) {
          if (j + kPrefetchRows < nrows) {
            prefetch_rows(kt + (j + kPrefetchRows) * ld, ld, 1, D);
            prefetch_rows(vt + (j + kPrefetchRows) * ld, ld, 1, D);
          }
          copy_row(kdst + j * D, kt + j * ld, D);
          copy_row(vdst + j * Dp, vt + j * ld, D);
          if (Dp > D) std::fill(vdst + j * Dp + D, vdst + (j + 1) * Dp, 0.f);
        }
      };
      if (whole) pack(item.kb, item.ke - item.kb, w.kp, w.vp);
      if (it + nt < n_items) {  // the item this thread likely takes next: its first Q rows and K, V rows to L2
        const Item& nx = items[it + nt];
        prefetch_rows(q + (nx.start + nx.q0) * ld + nx.h * D, ld, std::min(bm, nx.q1 - nx.q0), D);
        const int64_t nn = std::min<int64_t>(2 * kPrefetchRows, nx.ke - nx.kb);
        prefetch_rows(k + (nx.start + nx.kb) * ld + nx.h * D, ld, nn, D);
        prefetch_rows(v + (nx.start + nx.kb) * ld + nx.h * D, ld, nn, D);
      }

      for (int64_t i0 = item.q0; i0 < item.q1; i0 += bm) {
        const int64_t rows = std::min(bm, item.q1 - i0);
        const int64_t qcols = (rows + VW - 1) / VW;  // query registers in use
        const int64_t lanes = qcols * VW;
        // Q^T block (D x bm), pre-scaled; query lanes past the sequence are zero (computed, never written).
        for (int64_t r0 = 0; r0 < rows; r0 += PW)
          transpose_scaled(q + (item.start + i0 + r0) * ld + h * D, ld, std::min(PW, rows - r0), D, qscale,
                           w.qt + r0 * D, PW);
        for (int64_t r = rows; r < lanes; ++r)
          for (int64_t d = 0; d < D; ++d) w.qt[r / PW * PW * D + d * PW + r % PW] = 0.f;
        std::fill(w.o, w.o + rows * Dp, 0.f);
        std::fill(w.m, w.m + bm, M_INIT);
        std::fill(w.l, w.l + bm, 0.f);

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
              prefetch_rows(k + (item.start + j0 + BN) * ld + h * D, ld, nn, D);
              prefetch_rows(v + (item.start + j0 + BN) * ld + h * D, ld, nn, D);
            }
          }

          // S^T = K Q^T (log2 units): one row per key, one lane per query.
          product<false>({kp, D, 1, w.qt, PW, D, w.st, bm, nullptr, PW * D}, nk, qcols);

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
            for (int64_t j = 0; j < nk; ++j) {
              const vf p = vexp2(vload(st + j * bm) - m_new);
              vstore(st + j * bm, p);
              sum += p;
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
          const float inv = w.l[r] > 0.f ? 1.f / w.l[r] : 0.f;
          for (int64_t d = 0; d < D; ++d) ob[r * ld + d] = w.o[r * Dp + d] * inv;
        }
      }
    }
  }
  cache_free(mem);
}

}  // namespace fastenc_cpu
