// Raw-pointer C++/OpenMP rotate-half RoPE (csrc/cpu/rope.cpp; no torch headers), fp32.
#pragma once
#include <cstdint>

namespace fastenc_cpu {

// q: tokens x hq x d, k: tokens x hk x d; cos/sin: npos x half (rotary dim 2*half <= d); pos: tokens (int32).
// Writes qo, ko (same shapes); dims past 2*half are copied. inverse rotates by -angle (the backward). Returns how
// many tokens have a position outside [0, npos) (their rows are NaN; the table is not read).
int64_t rope_fwd(const float* q, const float* k, float* qo, float* ko, const float* cos, const float* sin,
                 const int32_t* pos, int64_t tokens, int64_t hq, int64_t hk, int64_t d, int64_t half, int64_t npos,
                 bool inverse, int64_t sq, int64_t sk);  // sq, sk: q's and k's token strides (outputs contiguous)

}  // namespace fastenc_cpu
