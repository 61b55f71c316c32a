// LoRA merge (Hu et al. 2021): out = W + scale * (B @ A), W (n_out x n_in) in T, A (rank x n_in) and B (n_out x
// rank) in fp32; fp32 accumulation over the rank in shared-memory chunks, one rounding into T, 16-byte W accesses.
#include "cuda_utils.h"
#include "merge_lora.h"

namespace fastenc_cuda {
namespace {

constexpr int kRows = 16;       // output rows per block (threadIdx.y)
constexpr int kColThreads = 16; // threads along a row (threadIdx.x), 8 columns each
constexpr int kCols = kColThreads * 8;
constexpr int kRankChunk = 32;  // rank slice staged in shared memory per step

// Block (kColThreads, kRows) owns out[r0:r0+16, c0:c0+128]; thread (tx, ty) owns row r0+ty, columns
// c0+8tx .. c0+8tx+7:  acc[j] = sum_r B[row, r] * A[r, col+j]  (fp32), out = W + scale * acc.
// VEC: n_in % 8 == 0 and 16-byte aligned rows, so a thread's 8 columns are all in range or all out.
template <typename T, bool VEC>
__global__ void __launch_bounds__(kColThreads * kRows) merge_lora_kernel(const T* w, const float* __restrict__ a,
                                                                         const float* __restrict__ b, T* out,
                                                                         float scale, int64_t n_out, int64_t n_in,
                                                                         int rank) {
  __shared__ __align__(16) float sa[kRankChunk][kCols];
  __shared__ float sb[kRows][kRankChunk + 1];
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * kColThreads + tx;
  const int64_t row = static_cast<int64_t>(blockIdx.y) * kRows + ty;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kCols;
  const int64_t col = c0 + tx * 8;
  float acc[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j] = 0.f;
  for (int r0 = 0; r0 < rank; r0 += kRankChunk) {
    // Stage A[r0:r0+32, c0:c0+128] and B[rows, r0:r0+32] as fp32 (zeros outside the matrices).
    for (int e = tid; e < kRankChunk * kCols; e += kColThreads * kRows) {
      const int rr = e / kCols, cc = e % kCols;
      const int64_t gc = c0 + cc;
      sa[rr][cc] = (r0 + rr < rank && gc < n_in) ? a[static_cast<int64_t>(r0 + rr) * n_in + gc] : 0.f;
    }
    for (int e = tid; e < kRows * kRankChunk; e += kColThreads * kRows) {
      const int rr = e / kRankChunk, cc = e % kRankChunk;
      const int64_t gr = static_cast<int64_t>(blockIdx.y) * kRows + rr;
      sb[rr][cc] = (gr < n_out && r0 + cc < rank) ? b[gr * rank + r0 + cc] : 0.f;
    }
    __syncthreads();
    const int steps = rank - r0 < kRankChunk ? rank - r0 : kRankChunk;
    for (int r = 0; r < steps; ++r) {
      const float bv = sb[ty][r];
      const float4 a0 = *reinterpret_cast<const float4*>(&sa[r][tx * 8]);
      const float4 a1 = *reinterpret_cast<const float4*>(&sa[r][tx * 8 + 4]);
      acc[0] += bv * a0.x; acc[1] += bv * a0.y; acc[2] += bv * a0.z; acc[3] += bv * a0.w;
      acc[4] += bv * a1.x; acc[5] += bv * a1.y; acc[6] += bv * a1.z; acc[7] += bv * a1.w;
    }
    __syncthreads();
  }
  if (row >= n_out) return;
  const int64_t base = row * n_in + col;
  if (VEC) {
    if (col >= n_in) return;
    float wv[8];
    load_f32<T, 8>(w + base, wv);
#pragma unroll
    for (int j = 0; j < 8; ++j) wv[j] += scale * acc[j];
    store_f32<T, 8>(out + base, wv);
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j)
      if (col + j < n_in) out[base + j] = from_float<T>(to_float(w[base + j]) + scale * acc[j]);
  }
}

}  // namespace

cudaError_t merge_lora_fwd(const void* weight, const float* lora_a, const float* lora_b, void* out, float scale,
                           int64_t n_out, int64_t n_in, int64_t rank, int dtype, cudaStream_t stream) {
  if (n_out == 0 || n_in == 0) return cudaSuccess;
  if (rank < 0 || rank > (1 << 30) || (n_out + kRows - 1) / kRows > 65535) return cudaErrorInvalidValue;
  return dispatch_dtype(dtype, [&](auto zero) -> cudaError_t {
    using T = decltype(zero);
    const T* wp = static_cast<const T*>(weight);
    T* op = static_cast<T*>(out);
    const dim3 grid(ceil_div(n_in, kCols), ceil_div(n_out, kRows)), block(kColThreads, kRows);
    const int r = static_cast<int>(rank);
    if (n_in % 8 == 0 && aligned16(weight) && aligned16(out))
      merge_lora_kernel<T, true><<<grid, block, 0, stream>>>(wp, lora_a, lora_b, op, scale, n_out, n_in, r);
    else
      merge_lora_kernel<T, false><<<grid, block, 0, stream>>>(wp, lora_a, lora_b, op, scale, n_out, n_in, r);
    return cudaGetLastError();
  });
}

}  // namespace fastenc_cuda
