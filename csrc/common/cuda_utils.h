// Device helpers shared by the .cu kernels (no torch headers): fp16/bf16 <-> float, 16-byte vector
// loads/stores of any element type, warp reductions, and the dtype switch the launchers use.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_dtype.h"

namespace fastenc_cuda {

// ---------------------------------------------------------------- scalar conversions
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Round a float through T and back (the value a store to T would keep).
template <typename T> __device__ __forceinline__ float round_to(float v) { return to_float(from_float<T>(v)); }

// ---------------------------------------------------------------- vectors of N elements of T
// A run of N elements moves as 16-byte accesses when sizeof(T) * N is a multiple of 16 (the caller
// guarantees 16-byte alignment), else element by element. Values are converted to/from fp32 registers.
template <typename T, int N>
struct alignas(16) Vec {
  T v[N];
};

template <typename T, int N>
__device__ __forceinline__ void load_f32(const T* __restrict__ p, float (&out)[N]) {
  constexpr int P = 16 / sizeof(T);
  if constexpr ((sizeof(T) * N) % 16 == 0) {
#pragma unroll
    for (int c = 0; c < N / P; ++c) {
      const Vec<T, P> t = reinterpret_cast<const Vec<T, P>*>(p)[c];
#pragma unroll
      for (int i = 0; i < P; ++i) out[c * P + i] = to_float(t.v[i]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_float(p[i]);
  }
}

template <typename T, int N>
__device__ __forceinline__ void store_f32(T* __restrict__ p, const float (&in)[N]) {
  constexpr int P = 16 / sizeof(T);
  if constexpr ((sizeof(T) * N) % 16 == 0) {
#pragma unroll
    for (int c = 0; c < N / P; ++c) {
      Vec<T, P> t;
#pragma unroll
      for (int i = 0; i < P; ++i) t.v[i] = from_float<T>(in[c * P + i]);
      reinterpret_cast<Vec<T, P>*>(p)[c] = t;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) p[i] = from_float<T>(in[i]);
  }
}

// ---------------------------------------------------------------- reductions
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the blockDim.x threads of one row group (a warp, or the whole block when blockDim.y == 1).
// `scratch` holds at least 32 floats; every thread of the group must call it.
__device__ __forceinline__ float group_sum(float v, float* scratch) {
  v = warp_sum(v);
  if (blockDim.x <= 32) return v;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : 0.f;
  return warp_sum(v);
}

// ---------------------------------------------------------------- alignment / dispatch helpers
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

inline int elem_size(int dtype) { return dtype == kF32 ? 4 : 2; }

// Calls f(T{}) with T the element type for the dtype code; returns cudaErrorInvalidValue for others.
template <typename F>
inline cudaError_t dispatch_dtype(int dtype, F&& f) {
  switch (dtype) {
    case kF32: return f(float{});
    case kF16: return f(__half{});
    case kBF16: return f(__nv_bfloat16{});
    default: return cudaErrorInvalidValue;
  }
}

inline unsigned int ceil_div(int64_t a, int64_t b) { return static_cast<unsigned int>((a + b - 1) / b); }

// Blocks for a grid-stride loop over `work` items with `threads` per block (capped; the loop covers the rest).
inline unsigned int grid_for(int64_t work, int threads) {
  const int64_t blocks = (work + threads - 1) / threads;
  return static_cast<unsigned int>(blocks < 1 ? 1 : (blocks > (1 << 20) ? (1 << 20) : blocks));
}

}  // namespace fastenc_cuda
