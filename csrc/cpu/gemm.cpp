// GEMM on a prepacked weight: y = x W^T (+ bias) (+ y), fp32, fastenc.layers.Linear's CPU inference GEMM. Built for
// the batch-1 GEMMs first (tens of rows against a weight of up to a few million elements, where a BLAS sgemm
// re-packs the weight panels on every call and its blocking is tuned for large M), then blocked for tall x.
//
// Layout: W (N, K) is packed once into panels of NW = NC * VW columns, panel p holding W[p*NW + j][k] at
// [p][k][j] (K x NW contiguous, zero columns past N). y's rows are taken MR at a time: an MR x NW tile keeps
// MR * NC vector accumulators in registers; each k step loads NC vectors of the panel, broadcasts MR values of x
// and does MR * NC FMAs: y[i][j] = sum_k x[i][k] * W[j][k], k ascending. A panel (K x NW floats: 24-192 KiB at
// K = 384-3072) stays in L1/L2 while every row block of x passes over it. Each thread takes one contiguous,
// balanced range of panels and streams it in address order.
// Prefetch: a panel read from memory by its first row block alone leaves the memory idle while the later row blocks
// run from L2, so memory and FMA time added up (16 rows, BERT-base's 340 MB of weights, one thread: 5.5 GB/s of an
// 11-13 GB/s read rate). The first min(row blocks, kPrefetchMaxTiles) row blocks therefore prefetch into L2 the
// thread's next panel, each a share in proportion to its rows (pf_step floats per k step), so the next panel
// streams in while this one is computed; the later row blocks of a taller x run on the current panel alone.
// Measured single-threaded with thread CPU time, under load, against the same kernel without prefetch, cycling
// through 12 BERT-base layers' weights (340 MB): 16 rows 0.77-0.87x the time, 8 rows 0.70-0.83x, 3-5 rows
// 0.83-0.90x, 1 row level; through MiniLM's 6 layers (42 MB) at 16 rows 0.86x. Above kPrefetchMaxTiles row blocks
// (when none prefetched), against the same kernel without prefetch, BERT-base's 12 layers: 128 rows 0.94x
// [0.91, 0.98], 64 rows 0.88x [0.87, 0.92], 32 rows 0.79x [0.76, 0.81] (median [20 %, 80 %] of 15 paired rounds).
// Blocking: above kTallRows rows, x no longer fits in L2 beside a panel, and a thread streaming its panels would
// read all of x again from L3 for each one. There the GEMM runs in k blocks of at most kBlockK steps (K = 3072 in
// three) and, within each, in row blocks of kBlockXBytes of x (84 rows at K = 768, 1024-step blocks: 60 rows);
// each row block passes over the thread's panels, so its part of x is read from L2. A k block after the first adds
// to the y the one before it stored (its bias and residual taken once, the GELU after the last), so the sum keeps
// its order: y[i][j] = bias + y_old + sum over k ascending, bit for bit the unblocked result. A tall x against a
// narrow weight (under kMinPanelsPerThread panels a thread) splits the row blocks over the threads instead of the
// panels. Two threads, 12 layers' weights cycled (python -m fastenc.benchmark.gemm_pack --threads 2 --layers 12),
// quiet VM, at 3200 rows the better of MKL's sgemm and oneDNN's packed GEMM took 1.09x the blocked GEMM's time and
// 0.87x the unblocked one's at K = 768 x N = 768, 1.00x and 0.89x at K = 3072 x N = 768; 512-step k blocks lost to
// 1024-step ones (0.98-1.03x against 1.00-1.09x).
// Epilogue: the bias is the accumulators' start value and the residual (accumulate) is added before the k loop, so
// y = x W^T + bias + y_old leaves the registers once; with an activation (the MLP's first projection) each row
// block's GELU runs on its just-stored MR x NW tile while it is still in L1 (fast_math.h's fm_gelu_erf / tanh, the
// math of act.cpp's GELU kernel, inlined: calling that kernel per tile row would open an OpenMP region per call,
// ~0.5 us each), instead of a second pass over the (rows, N) output after the GEMM.
#include <algorithm>
#include <cstring>

#include <omp.h>
#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "fast_math.h"
#include "gemm.h"
#include "parallel.h"

namespace fastenc_cpu {

namespace {

#if defined(__AVX512F__)
// 14 rows: 28 accumulators of the 32 registers (the row loops below are fully unrolled, else the accumulators live in
// memory). Two threads, one process, interleaved against the same kernel with 6 rows (an AMX-era Xeon, AVX-512):
// 0.78-0.90x the time from 8 to 1,576 rows at K = 384-3072 (1 row and 5 rows level).
constexpr int VW = 16, NC = 2, MR = 14;
#elif defined(__AVX__)
constexpr int VW = 8, NC = 2, MR = 6;
#else
constexpr int VW = 4, NC = 2, MR = 4;
#endif
constexpr int NW = VW * NC;
typedef float vf __attribute__((vector_size(VW * 4)));

inline vf load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof(vf));
  return v;
}
inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof(vf)); }
// All lanes = *p: one broadcast load (`vf{} + *p` would add 0.0 first: -0.0 + 0.0 is not an identity).
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

// One R x NW tile: rows x[0..R) (row stride ldx), panel wp (K x NW), columns [0, ncols) of y written.
// Software prefetch of the next panel (module comment): before k steps [k0, k0 + kPrefetchBlock), the lines of
// pf[k0 * pf_step, (k0 + kPrefetchBlock) * pf_step) below pf_len are requested into L2 (pf == nullptr: none).
struct Prefetch {
  const float* pf = nullptr;
  int64_t pf_step = 0, pf_len = 0;
};

// Read prefetch into L2 (prefetcht1 on x86; every ISA branch compiles it).
inline void prefetch_l2(const float* p) { __builtin_prefetch(p, 0, 2); }

// Row blocks that prefetch the next panel (the first 24 rows on AVX2): spreading the panel over every row block of a
// tall x gives each a few lines requested again and again (all 22 blocks of 127 rows measured 1.2x slower); 8
// blocks instead of 4 measured level at 64 and 128 rows.
constexpr int64_t kPrefetchMaxTiles = 4;
// k steps per batch of prefetch requests: one request per line and one branch per block, not per k step (a request
// per step slowed MiniLM's K = 384 GEMMs by 5-30 %).
constexpr int64_t kPrefetchBlock = 16;
// Blocking of a tall x (module comment): above kTallRows rows, k blocks of at most kBlockK steps and row blocks of
// kBlockXBytes of x per k block (half of a 512 KiB L2: 84 rows at K = 768).
constexpr int64_t kTallRows = 128;
constexpr int64_t kBlockK = 1024;
constexpr int64_t kBlockXBytes = 256 * 1024;
constexpr int64_t kMinPanelsPerThread = 4;

template <int R>
void tile(const float* __restrict x, int64_t ldx, const float* __restrict wp, int64_t K,
          const float* __restrict bias, float* __restrict y, int64_t ldy, bool accumulate, int64_t ncols,
          Prefetch pf) {
  vf acc[R][NC];
  float edge[NW];  // a partial panel's bias / y row, zero-padded to NW columns
  const bool full = ncols == NW;
#pragma GCC unroll 16
  for (int c = 0; c < NC; ++c) {
    vf b0 = {};
    if (bias != nullptr) {
      if (full) {
        b0 = load(bias + c * VW);
      } else {
        for (int j = 0; j < VW; ++j) edge[j] = c * VW + j < ncols ? bias[c * VW + j] : 0.f;
        b0 = load(edge);
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) acc[r][c] = b0;
  }
  if (accumulate) {
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const float* yr = y + r * ldy;
      if (!full) {
        for (int j = 0; j < NW; ++j) edge[j] = j < ncols ? yr[j] : 0.f;
        yr = edge;
      }
#pragma GCC unroll 16
      for (int c = 0; c < NC; ++c) acc[r][c] += load(yr + c * VW);
    }
  }
  for (int64_t k0 = 0; k0 < K; k0 += kPrefetchBlock) {
    const int64_t k1 = std::min(K, k0 + kPrefetchBlock);
    if (pf.pf != nullptr) {  // this block's pf[k0 * pf_step, k1 * pf_step), one request per 64-byte line
      const int64_t a = k0 * pf.pf_step, b = std::min(k1 * pf.pf_step, pf.pf_len);
      for (int64_t o = a; o < b; o += 16) prefetch_l2(pf.pf + o);
      if (a < b) prefetch_l2(pf.pf + b - 1);
    }
    for (int64_t k = k0; k < k1; ++k) {
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
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    float* yr = y + r * ldy;
    if (full) {
#pragma GCC unroll 16
      for (int c = 0; c < NC; ++c) store(yr + c * VW, acc[r][c]);
    } else {
#pragma GCC unroll 16
      for (int c = 0; c < NC; ++c) store(edge + c * VW, acc[r][c]);
      std::memcpy(yr, edge, sizeof(float) * ncols);
    }
  }
}

template <int R>
void tile_rows(int64_t rows, const float* x, int64_t ldx, const float* wp, int64_t K, const float* bias, float* y,
               int64_t ldy, bool accumulate, int64_t ncols, Prefetch pf) {
  if constexpr (R > 1) {
    if (rows < R) return tile_rows<R - 1>(rows, x, ldx, wp, K, bias, y, ldy, accumulate, ncols, pf);
  }
  tile<R>(x, ldx, wp, K, bias, y, ldy, accumulate, ncols, pf);
}

// y = gelu(y) on rows x ncols (rows ldy apart), exact (erf) or tanh form.
template <bool TANH>
void gelu_tile(float* y, int64_t ldy, int64_t rows, int64_t ncols) {
  for (int64_t r = 0; r < rows; ++r) {
    float* yr = y + r * ldy;
#pragma omp simd
    for (int64_t j = 0; j < ncols; ++j) yr[j] = TANH ? fm_gelu_tanh(yr[j]) : fm_gelu_erf(yr[j]);
  }
}

}  // namespace

int64_t gemm_panel_width() { return NW; }

void gemm_pack(const float* w, int64_t n, int64_t k, float* out) {
  const int64_t panels = (n + NW - 1) / NW;
  for (int64_t p = 0; p < panels; ++p)
    for (int64_t kk = 0; kk < k; ++kk)
      for (int64_t j = 0; j < NW; ++j) {
        const int64_t row = p * NW + j;
        out[(p * k + kk) * NW + j] = row < n ? w[row * k + kk] : 0.f;
      }
}

namespace {

// One thread's panels [p0, p1) over rows [0, m) and k steps [0, k) of x (the whole GEMM when the call is not
// blocked): the row blocks of MR rows pass over each panel in turn, the first kPrefetchMaxTiles of them prefetching
// the next panel (module comment). wp / panel_len: the panels' base and full length (K x NW), x and the panels
// already offset to the k block's first step; act runs after the last k block only.
void panel_range(const float* x, int64_t m, int64_t k, int64_t ldx, const float* wp, int64_t panel_len, int64_t n,
                 int64_t p0, int64_t p1, const float* bias, float* y, int64_t ldy, bool accumulate,
                 GemmActivation act) {
  // ceil(m / MR) row blocks of near-equal height (16 rows: two of 8, not 14 + 2, whose 2-row tile runs at a
  // fraction of the FMA rate); block ti holds rows [m * ti / nblocks, m * (ti + 1) / nblocks).
  const int64_t nblocks = (m + MR - 1) / MR;
  const int64_t mp = m * std::min(nblocks, kPrefetchMaxTiles) / nblocks;  // rows of the row blocks that prefetch
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t c0 = p * NW, ncols = std::min<int64_t>(NW, n - c0);
    const float* panel = wp + p * panel_len;
    const float* b = bias != nullptr ? bias + c0 : nullptr;
    for (int64_t ti = 0; ti < nblocks; ++ti) {
      const int64_t i0 = m * ti / nblocks, rows = m * (ti + 1) / nblocks - i0;
      Prefetch pf;
      if (p + 1 < p1 && ti < kPrefetchMaxTiles) {  // this tile's share of the next panel, in proportion to its rows
        const int64_t step = (NW * rows + mp - 1) / mp, start = i0 * k * NW / mp, len = k * NW;
        if (start < len) pf = Prefetch{panel + panel_len + start, step, std::min(len - start, k * step)};
      }
      float* yt = y + i0 * ldy + c0;
      tile_rows<MR>(rows, x + i0 * ldx, ldx, panel, k, b, yt, ldy, accumulate, ncols, pf);
      if (act == GemmActivation::kGelu)  // gelu(y) in place on the tile's rows (bias already in y)
        gelu_tile<false>(yt, ldy, rows, ncols);
      else if (act == GemmActivation::kGeluTanh)
        gelu_tile<true>(yt, ldy, rows, ncols);
    }
  }
}

}  // namespace

void gemm_packed(const float* x, int64_t m, int64_t k, int64_t ldx, const float* wp, int64_t n, const float* bias,
                 float* y, int64_t ldy, bool accumulate, int num_threads, GemmActivation act) {
  const int64_t panels = (n + NW - 1) / NW, panel_len = k * NW;
  // Tall x (module comment, "Blocking"): k blocks of at most kBlockK steps (equal lengths), row blocks of the rows
  // whose k block fills kBlockXBytes; up to kTallRows rows one block of each, the loop of the few-row GEMM.
  const bool tall = m > kTallRows;
  const int nt = worth_parallel(m * n * k, kParallelMinGemmFmas) && (panels > 1 || tall)
                     ? (num_threads > 0 ? num_threads : omp_get_max_threads()) : 1;
  const int64_t kblocks = tall ? (k + kBlockK - 1) / kBlockK : 1;
  const int64_t kc = (k + kblocks - 1) / kblocks;
  const int64_t mc = tall ? std::max<int64_t>(MR, kBlockXBytes / (int64_t(sizeof(float)) * kc) / MR * MR) : m;
  const int64_t row_blocks = (m + mc - 1) / mc;
  // A tall x with under kMinPanelsPerThread panels a thread (a narrow weight, many threads): the team splits the
  // row blocks instead, each thread taking every panel over its rows.
  const bool split_rows = tall && panels < kMinPanelsPerThread * nt && row_blocks > 1;
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    // Each thread one contiguous, balanced range of panels, streamed in address order (or of row blocks).
    const int64_t team = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t p0 = split_rows ? 0 : panels * t / team, p1 = split_rows ? panels : panels * (t + 1) / team;
    const int64_t r0 = split_rows ? row_blocks * t / team : 0;
    const int64_t r1 = split_rows ? row_blocks * (t + 1) / team : row_blocks;
    for (int64_t k0 = 0; k0 < k; k0 += kc) {
      const int64_t kn = std::min(kc, k - k0);
      const bool first = k0 == 0, last = k0 + kn == k;
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t i0 = r * mc;
        panel_range(x + i0 * ldx + k0, std::min(mc, m - i0), kn, ldx, wp + k0 * NW, panel_len, n, p0, p1,
                    first ? bias : nullptr, y + i0 * ldy, ldy, first ? accumulate : true,
                    last ? act : GemmActivation::kNone);
      }
    }
  }
}

}  // namespace fastenc_cpu
