// SPLADE max-pooled sparse weights: out[s][v] = log1p(relu(max_t (x_t . W_v) + b_v)) over the tokens t of sequence
// s, fp32. A GEMM of the packed tokens against the vocabulary projection whose epilogue keeps a running max per
// (sequence, vocabulary column): the (tokens, V) logits are never stored, not even a tile of them.
//
// Blocking (the packed-panel GEMM's register tile, csrc/cpu/gemm.cpp): the vocabulary is cut into blocks of PB
// panels of NW = NC * VW columns; a thread packs its block of W (NW columns per panel, [k][j] order, zero past V)
// into a buffer of at most kBlockBytes (L2), then for each sequence walks its tokens MR rows at a time: the MR x H
// rows of x stay in L1 while the PB panels pass over them, each panel giving an MR x NW tile of logits in MR * NC
// vector accumulators, y[i][j] = sum_k x[i][k] * W[j][k], k ascending. The tile is reduced in registers: the max
// over its rows joins the sequence's running max (NC vectors per panel); after the sequence's last row the bias is
// added to the max (max(a + b) = max(a) + b) and log1p(relu(.)) (monotone, so after the max) written out.
// Threads split the vocabulary blocks (one contiguous, balanced range each); W is read once per call. A W packed
// beforehand (sparse_max_pack: the same panels, all of them) is read in place instead: no packing in the call.
// Work: 2 * tokens * V * H flops (the projection); the epilogue is O(batch * V).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <omp.h>
#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "parallel.h"
#include "sparse_max.h"

namespace fastenc_cpu {

namespace {

#if defined(__AVX512F__)
// 12 rows (24 accumulators of 32 registers; the row loops fully unrolled, else the accumulators live in memory):
// BERT-base's MLM head at 8 x 128 tokens, 2 threads, in one process with both variants interleaved, 8 rows took
// 1.02-1.06x the time of 12 rows (14 rows: level with 12).
constexpr int VW = 16, NC = 2, MR = 12;
#elif defined(__AVX__)
constexpr int VW = 8, NC = 2, MR = 6;
#else
constexpr int VW = 4, NC = 2, MR = 4;
#endif
constexpr int NW = VW * NC;
typedef float vf __attribute__((vector_size(VW * 4)));

// The packed block of W one thread holds at a time (half of a 2 MiB L2; at least one panel).
constexpr int64_t kBlockBytes = 256 * 1024;
constexpr int64_t kMaxPanels = 8;

inline vf load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof(vf));
  return v;
}
inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof(vf)); }
inline vf splat(const float* p) {
#if defined(__AVX512F__)
  return (vf)_mm512_set1_ps(*p);
#elif defined(__AVX__)
  return (vf)_mm256_broadcast_ss(p);
#else
  vf v;
  for (int i = 0; i < VW; ++i) v[i] = *p;
  return v;
#endif
}
inline vf vmax(vf a, vf b) {
#if defined(__AVX512F__)
  return (vf)_mm512_max_ps((__m512)a, (__m512)b);
#elif defined(__AVX__)
  return (vf)_mm256_max_ps((__m256)a, (__m256)b);
#else
  vf r;
  for (int i = 0; i < VW; ++i) r[i] = a[i] > b[i] ? a[i] : b[i];
  return r;
#endif
}

// R rows of x (row stride ldx) against one packed panel (H x NW): m[c] = max(m[c], max over the R rows of the
// tile's column vector c). The logits live only in the R * NC accumulators.
template <int R>
inline void tile_max(const float* __restrict x, int64_t ldx, const float* __restrict wp, int64_t H, vf* m) {
  vf acc[R][NC];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int c = 0; c < NC; ++c) acc[r][c] = vf{};
  for (int64_t k = 0; k < H; ++k) {
    vf b[NC];
#pragma GCC unroll 16
    for (int c = 0; c < NC; ++c) b[c] = load(wp + k * NW + c * VW);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const vf a = splat(x + r * ldx + k);
#pragma GCC unroll 16
      for (int c = 0; c < NC; ++c) acc[r][c] += a * b[c];
    }
  }
#pragma GCC unroll 16
  for (int c = 0; c < NC; ++c) {
    vf v = acc[0][c];
#pragma GCC unroll 16
    for (int r = 1; r < R; ++r) v = vmax(v, acc[r][c]);
    m[c] = vmax(m[c], v);
  }
}

template <int R>
void tile_rows(int64_t rows, const float* x, int64_t ldx, const float* wp, int64_t H, vf* m) {
  if constexpr (R > 1) {
    if (rows < R) return tile_rows<R - 1>(rows, x, ldx, wp, H, m);
  }
  tile_max<R>(x, ldx, wp, H, m);
}

// Panels [p0, p0 + np) of W (V, H) -> buf (np, H, NW): panel q holds W[(p0 + q) * NW + j][k] at [q][k][j], 0 past V.
void pack_block(const float* w, int64_t V, int64_t H, int64_t p0, int64_t np, float* buf) {
  for (int64_t q = 0; q < np; ++q) {
    float* dst = buf + q * H * NW;
    for (int64_t j = 0; j < NW; ++j) {
      const int64_t row = (p0 + q) * NW + j;
      if (row < V) {
        const float* src = w + row * H;
        for (int64_t k = 0; k < H; ++k) dst[k * NW + j] = src[k];
      } else {
        for (int64_t k = 0; k < H; ++k) dst[k * NW + j] = 0.f;
      }
    }
  }
}

}  // namespace

int64_t sparse_max_panel_width() { return NW; }

void sparse_max_pack(const float* w, int64_t V, int64_t H, float* out, int num_threads) {
  const int64_t panels = (V + NW - 1) / NW;
  const int nt = worth_parallel(V * H, kParallelMinGemmFmas) ? (num_threads > 0 ? num_threads : omp_get_max_threads())
                                                             : 1;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int64_t p = 0; p < panels; ++p) pack_block(w, V, H, p, 1, out + p * H * NW);
}

void sparse_max_fwd(const float* x, int64_t ldx, int64_t H, const int32_t* cu, int64_t batch, const float* w,
                    int64_t V, const float* bias, float* out, int num_threads, const float* packed) {
  if (batch <= 0 || V <= 0) return;
  const int64_t panels = (V + NW - 1) / NW;
  const int64_t pb = std::clamp<int64_t>(kBlockBytes / (int64_t(sizeof(float)) * NW * std::max<int64_t>(H, 1)), 1,
                                         kMaxPanels);
  const int64_t blocks = (panels + pb - 1) / pb;
  const int64_t tokens = int64_t(cu[batch]) - int64_t(cu[0]);
  const int nt = worth_parallel(tokens * V * H, kParallelMinGemmFmas) && blocks > 1
                     ? (num_threads > 0 ? num_threads : omp_get_max_threads()) : 1;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    const int64_t team = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t b0 = blocks * t / team, b1 = blocks * (t + 1) / team;
    std::vector<float> buf(b1 > b0 && packed == nullptr ? size_t(pb * H * NW) : 0);
    std::vector<vf> m(size_t(pb * NC));
    float row[NW];
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t p0 = blk * pb, np = std::min(pb, panels - p0);
      const float* wb = packed != nullptr ? packed + p0 * H * NW : buf.data();
      if (packed == nullptr) pack_block(w, V, H, p0, np, buf.data());
      for (int64_t s = 0; s < batch; ++s) {
        const int64_t t0 = cu[s], t1 = cu[s + 1];
        vf ninf;
        for (int i = 0; i < VW; ++i) ninf[i] = kNegInf;
        for (int64_t i = 0; i < np * NC; ++i) m[i] = ninf;
        for (int64_t i0 = t0; i0 < t1; i0 += MR) {
          const int64_t rows = std::min<int64_t>(MR, t1 - i0);
          for (int64_t q = 0; q < np; ++q)
            tile_rows<MR>(rows, x + i0 * ldx, ldx, wb + q * H * NW, H, m.data() + q * NC);
        }
        // Epilogue: + bias after the max, log1p(relu(.)); an empty sequence keeps -inf, which gives 0.
        for (int64_t q = 0; q < np; ++q) {
          const int64_t c0 = (p0 + q) * NW, ncols = std::min<int64_t>(NW, V - c0);
          for (int c = 0; c < NC; ++c) store(row + c * VW, m[q * NC + c]);
          float* o = out + s * V + c0;
          for (int64_t j = 0; j < ncols; ++j) {
            const float v = row[j] + (bias != nullptr ? bias[c0 + j] : 0.f);
            o[j] = v > 0.f ? std::log1p(v) : 0.f;
          }
        }
      }
    }
  }
}

}  // namespace fastenc_cpu
