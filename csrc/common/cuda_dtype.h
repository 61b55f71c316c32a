// The dtype code the CUDA launchers take (csrc/<op>/<op>.h): which element type a tensor holds. Shared by the .cu
// kernels (cuda_utils.h's dispatch) and the torch-side wrappers (cuda_bind.h's cuda_dtype); no CUDA or torch headers.
#pragma once

namespace fastenc_cuda {

enum DType : int { kF32 = 0, kF16 = 1, kBF16 = 2 };

}  // namespace fastenc_cuda
