// Raw-pointer C++/OpenMP LoRA kernels (no torch headers). Row-major contiguous fp32.
#pragma once
#include <cstdint>

namespace fastenc_cpu {

// out = w + scale * b @ a;  w, out: rows x cols; a: r x cols; b: rows x r. fp32 accumulation per row.
// out may alias w.
void merge_lora_fwd(const float* w, const float* a, const float* b, float* out, int64_t rows, int64_t cols,
                    int64_t r, float scale);

}  // namespace fastenc_cpu
