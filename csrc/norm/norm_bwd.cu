// LayerNorm / RMSNorm backward from the forward's per-row fp32 mean and rstd. A block owns rows blockIdx.x,
// blockIdx.x + gridDim.x, ...; the row lives in registers (element loads: any alignment, any width), dx is written
// row by row, and the block's dweight/dbias sums stay in registers (per thread, its own columns) until one fp32
// partial row per block is written; the caller sums the partial rows (a second, small pass).
#include "cuda_utils.h"
#include "norm.h"

namespace fastenc_cuda {
namespace {

constexpr int kMaxParts = 512;  // partial rows (blocks) at most: a few per SM on any current GPU

// Per row, n = hidden, xhat = (h - mean) * rstd, g = w * dy:
//   LayerNorm: dx = rstd * (g - sum(g)/n - xhat * sum(g * xhat)/n)      (mean == nullptr: RMSNorm, no sum(g) term)
//   dx += dh (gradient arriving on the stored residual stream), dw += dy * xhat, db += dy.
// Thread t holds columns i * blockDim.x + t, i < NV.
template <typename T, int NV>
__global__ void __launch_bounds__(512, 1) norm_bwd_kernel(const T* __restrict__ dy, const T* __restrict__ dh,
                                                         const T* __restrict__ h, const T* __restrict__ w,
                                                         const float* __restrict__ mean,
                                                         const float* __restrict__ rstd, T* __restrict__ dx,
                                                         float* __restrict__ dw_part, float* __restrict__ db_part,
                                                         int64_t rows, int hidden) {
  __shared__ float scratch[32];
  const int tid = threadIdx.x, nt = blockDim.x;
  float aw[NV], ab[NV];  // w is re-read per row (L1-resident: every row reads the same hidden elements)
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    aw[i] = 0.f;
    ab[i] = 0.f;
  }
  const float inv_n = 1.f / static_cast<float>(hidden);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {  // uniform over the block: group_sum is safe
    const int64_t base = row * hidden;
    const float mu = mean != nullptr ? mean[row] : 0.f, rs = rstd[row];
    float d[NV], xh[NV], wv[NV];
    float s_g = 0.f, s_gx = 0.f;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int col = i * nt + tid;
      d[i] = 0.f;
      xh[i] = 0.f;
      wv[i] = 0.f;
      if (col < hidden) {
        wv[i] = to_float(w[col]);
        d[i] = to_float(dy[base + col]);
        xh[i] = (to_float(h[base + col]) - mu) * rs;
        const float g = d[i] * wv[i];
        s_g += g;
        s_gx += g * xh[i];
      }
    }
    const float c_g = mean != nullptr ? group_sum(s_g, scratch) * inv_n : 0.f;
    const float c_gx = group_sum(s_gx, scratch) * inv_n;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int col = i * nt + tid;
      if (col < hidden) {
        float v = rs * (d[i] * wv[i] - c_g - xh[i] * c_gx);
        if (dh != nullptr) v += to_float(dh[base + col]);
        dx[base + col] = from_float<T>(v);
        aw[i] += d[i] * xh[i];
        ab[i] += d[i];
      }
    }
  }
  const int64_t pbase = static_cast<int64_t>(blockIdx.x) * hidden;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int col = i * nt + tid;
    if (col < hidden) {
      if (dw_part != nullptr) dw_part[pbase + col] = aw[i];
      if (db_part != nullptr) db_part[pbase + col] = ab[i];
    }
  }
}

// Rows wider than the register cache: two passes over global memory per row (the second re-reads dy and h from
// L2), partial sums accumulated in the block's own partial row (each column owned by one thread: no races).
template <typename T>
__global__ void __launch_bounds__(1024) norm_bwd_wide_kernel(const T* __restrict__ dy, const T* __restrict__ dh,
                                                              const T* __restrict__ h, const T* __restrict__ w,
                                                              const float* __restrict__ mean,
                                                              const float* __restrict__ rstd, T* __restrict__ dx,
                                                              float* __restrict__ dw_part,
                                                              float* __restrict__ db_part, int64_t rows, int hidden) {
  __shared__ float scratch[32];
  const int64_t pbase = static_cast<int64_t>(blockIdx.x) * hidden;
  for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
    if (dw_part != nullptr) dw_part[pbase + c] = 0.f;
    if (db_part != nullptr) db_part[pbase + c] = 0.f;
  }
  const float inv_n = 1.f / static_cast<float>(hidden);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t base = row * hidden;
    const float mu = mean != nullptr ? mean[row] : 0.f, rs = rstd[row];
    float s_g = 0.f, s_gx = 0.f;
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
      const float g = to_float(dy[base + c]) * to_float(w[c]);
      s_g += g;
      s_gx += g * (to_float(h[base + c]) - mu) * rs;
    }
    const float c_g = mean != nullptr ? group_sum(s_g, scratch) * inv_n : 0.f;
    const float c_gx = group_sum(s_gx, scratch) * inv_n;
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
      const float d = to_float(dy[base + c]), xh = (to_float(h[base + c]) - mu) * rs;
      float v = rs * (d * to_float(w[c]) - c_g - xh * c_gx);
      if (dh != nullptr) v += to_float(dh[base + c]);
      dx[base + c] = from_float<T>(v);
      if (dw_part != nullptr) dw_part[pbase + c] += d * xh;
      if (db_part != nullptr) db_part[pbase + c] += d;
    }
  }
}

int pow2_ceil_bwd(int v) {
  int p = 1;
  while (p < v) p <<= 1;
  return p;
}

}  // namespace

int64_t norm_bwd_parts(int64_t rows) { return rows < kMaxParts ? (rows < 1 ? 1 : rows) : kMaxParts; }

cudaError_t norm_bwd(const void* dy, const void* dh, const void* h, const void* w, const float* mean,
                     const float* rstd, void* dx, float* dw_part, float* db_part, int64_t rows, int64_t hidden,
                     int dtype, cudaStream_t stream) {
  if (rows == 0 || hidden == 0) return cudaSuccess;
  if (hidden > (1 << 30) || rstd == nullptr) return cudaErrorInvalidValue;
  return dispatch_dtype(dtype, [&](auto zero) -> cudaError_t {
    using T = decltype(zero);
    const T* dyp = static_cast<const T*>(dy);
    const T* dhp = static_cast<const T*>(dh);
    const T* hp = static_cast<const T*>(h);
    const T* wp = static_cast<const T*>(w);
    T* dxp = static_cast<T*>(dx);
    const int n = static_cast<int>(hidden);
    const unsigned grid = static_cast<unsigned>(norm_bwd_parts(rows));
    // about 4 columns per thread, 64..512 threads (<= 128 registers each); NV = columns per thread rounded up to a
    // power of two: rows up to 4096 in registers
    int threads = ((n + 3) / 4 + 31) / 32 * 32;
    threads = threads < 64 ? 64 : (threads > 512 ? 512 : threads);
    const int nv = pow2_ceil_bwd((n + threads - 1) / threads);
    switch (nv) {
#define FASTENC_NORM_BWD_CASE(N)                                                                                  \
  case N:                                                                                                         \
    norm_bwd_kernel<T, N><<<grid, threads, 0, stream>>>(dyp, dhp, hp, wp, mean, rstd, dxp, dw_part, db_part, rows, n); \
    break;
      FASTENC_NORM_BWD_CASE(1)
      FASTENC_NORM_BWD_CASE(2)
      FASTENC_NORM_BWD_CASE(4)
      FASTENC_NORM_BWD_CASE(8)
#undef FASTENC_NORM_BWD_CASE
      default:
        norm_bwd_wide_kernel<T><<<grid, 1024, 0, stream>>>(dyp, dhp, hp, wp, mean, rstd, dxp, dw_part, db_part, rows, n);
    }
    return cudaGetLastError();
  });
}

}  // namespace fastenc_cuda
