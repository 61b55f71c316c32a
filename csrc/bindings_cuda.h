// The one entry point of bindings_cuda.cpp (the cuda half's op bindings), called by bindings.cpp's module
// definition when it is compiled with -DFASTENC_WITH_CUDA.
#pragma once

#include <torch/extension.h>

namespace fastenc_bindings {
// Adds the *_cuda ops (layer_norm_cuda, ..., attention_cuda) to the module.
void bind_cuda(pybind11::module_& m);
}  // namespace fastenc_bindings
