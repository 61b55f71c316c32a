// Raw-pointer C++/OpenMP LayerNorm / RMSNorm forward (csrc/cpu/norm.cpp; no torch headers). Row-major contiguous;
// fp32, or bf16 storage (raw bits) with fp32 math.
#pragma once
#include <cstdint>

namespace fastenc_cpu {

// LayerNorm (rms=false) or RMSNorm (rms=true) of h = x (+ xbias) (+ residual) over rows x hidden; xbias (hidden)
// is the preceding linear's bias. residual, xbias, bias, residual_out may be null; residual_out receives h.
// mean_out, rstd_out (rows, fp32; null when not wanted; mean_out unused for RMSNorm): the per-row statistics.
void norm_fwd(const float* x, const float* residual, const float* xbias, const float* weight, const float* bias,
              float* out, float* residual_out, int64_t rows, int64_t hidden, float eps, bool rms,
              float* mean_out = nullptr, float* rstd_out = nullptr);
// bf16 storage: one rounding per stored value; h = x + xb + r is rounded to bf16 and normalized from the rounded value.
void norm_fwd_bf16(const uint16_t* x, const uint16_t* residual, const uint16_t* xbias, const uint16_t* weight,
                   const uint16_t* bias, uint16_t* out, uint16_t* residual_out, int64_t rows, int64_t hidden,
                   float eps, bool rms, float* mean_out = nullptr, float* rstd_out = nullptr);

}  // namespace fastenc_cpu
