// Raw-pointer C++/OpenMP LayerNorm / RMSNorm backward (no torch headers). Row-major contiguous.
#pragma once
#include <cstdint>

namespace fastenc_cpu {

// Per row of h (rows x hidden), with the forward's fp32 statistics mean (null for RMSNorm) and rstd:
//   xhat = (h - mean) * rstd, g = w * dy,
//   LayerNorm: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) (+ dh);  RMSNorm: dx = rstd * (g - xhat * mean(g * xhat)) (+ dh)
//   dw = sum over rows of dy * xhat, db = sum over rows of dy (fp32).
// dh, dw, db may be null (not wanted). dx may not alias the inputs.
void norm_bwd(const float* dy, const float* dh, const float* h, const float* w, const float* mean, const float* rstd,
              float* dx, float* dw, float* db, int64_t rows, int64_t hidden);
// bf16 storage (raw bits) for dy, dh, h, w, dx; fp32 statistics and dw, db.
void norm_bwd_bf16(const uint16_t* dy, const uint16_t* dh, const uint16_t* h, const uint16_t* w, const float* mean,
                   const float* rstd, uint16_t* dx, float* dw, float* db, int64_t rows, int64_t hidden);

}  // namespace fastenc_cpu
