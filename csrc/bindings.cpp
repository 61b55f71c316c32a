// The module definition of fastenc's C++ extension, and the CPU buffer cache. Each op's torch-facing wrappers live
// with the op and register themselves (FASTENC_BINDINGS, common/op_registry.h); the module walks that list.
// Compiled into two modules that load and fail independently (fastenc/extension.py, setup.py):
//   cpu half  (fastenc_ext_cpu / fastenc._C):       this file + csrc/cpu/*.cpp (kernels, and <op>_bind.cpp wrappers)
//   cuda half (fastenc_ext_cuda / fastenc._C_cuda): this file with -DFASTENC_WITH_CUDA + csrc/<op>/*.cpp (wrappers,
//                                                   <op>_bind.cpp) + csrc/<op>/*.cu (kernels)
// so the buffer cache (a cpu-half thing) sits under #ifndef FASTENC_WITH_CUDA.
#include <torch/version.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "op_registry.h"

#ifndef FASTENC_WITH_CUDA
#include "cpu/buffer_cache.h"
#include "cpu/tensor_utils.h"

// ---------------------------------------------------------------- buffer cache (cpu)
// Outputs of the CPU kernels from fastenc's caching allocator (csrc/cpu/buffer_cache.h): large blocks are reused
// across layers and calls instead of being faulted in afresh. FASTENC_CPU_CACHE=0 (or set_buffer_cache(false))
// gives plain at::empty. Such tensors cannot be resized in place (like any tensor over external memory).
namespace {

bool& cache_enabled() {
  static bool on = [] {
    const char* v = std::getenv("FASTENC_CPU_CACHE");
    return v == nullptr || std::string(v) != "0";
  }();
  return on;
}

}  // namespace

at::Tensor fastenc_torch::cpu_empty(at::IntArrayRef sizes, const at::TensorOptions& opts) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  const size_t bytes = (size_t)n * c10::elementSize(c10::typeMetaToScalarType(opts.dtype()));
  if (!cache_enabled() || bytes < fastenc_cpu::kCacheMinBytes || !opts.device().is_cpu())
    return at::empty(sizes, opts);
  void* p = fastenc_cpu::cache_alloc(bytes);
  return at::from_blob(p, sizes, [](void* q) { fastenc_cpu::cache_free(q); }, opts);
}

namespace {

// Python: an uninitialized CPU tensor of `sizes` with like's dtype, from the cache (fastenc.layers.Linear's output).
at::Tensor buffer_empty(std::vector<int64_t> sizes, const at::Tensor& like) {
  return fastenc_torch::cpu_empty(sizes, like.options().device(at::kCPU));
}

std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t> buffer_cache_stats() {
  const auto s = fastenc_cpu::cache_stats();
  return {s.in_use_bytes, s.cached_bytes, s.peak_bytes, s.hits, s.misses};
}

void set_buffer_cache(bool on) {
  cache_enabled() = on;
  if (!on) fastenc_cpu::cache_release();
}

}  // namespace

FASTENC_BINDINGS(buffer_cache) {
  m.def("buffer_empty", &buffer_empty, "uninitialized CPU tensor from the buffer cache");
  m.def("buffer_cache_stats", &buffer_cache_stats, "(in use, cached, peak in use, hits, misses): bytes, counts");
  m.def("buffer_cache_release", &fastenc_cpu::cache_release, "free every cached block");
  m.def("set_buffer_cache", &set_buffer_cache, "turn the buffer cache on or off (off also frees it)");
  m.def("buffer_cache_enabled", [] { return cache_enabled(); });
}
#endif  // !FASTENC_WITH_CUDA (cpu half)

std::vector<std::pair<const char*, fastenc_bind::Binder>>& fastenc_bind::binders() {
  static std::vector<std::pair<const char*, Binder>> list;
  return list;
}

namespace {

std::string torch_version() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

bool has_cuda() {
#ifdef FASTENC_WITH_CUDA
  return true;
#else
  return false;
#endif
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "fastenc C++ extension: CPU (C++/OpenMP) or, built with FASTENC_WITH_CUDA, CUDA kernels";
  m.def("torch_version", &torch_version, "torch version the extension was built against");
  m.def("has_cuda", &has_cuda);
  // Every op's registered bindings (csrc/cpu/*_bind.cpp, or csrc/<op>/*_bind.cpp in the cuda half), by name.
  auto binders = fastenc_bind::binders();
  std::sort(binders.begin(), binders.end(),
            [](const auto& a, const auto& b) { return std::strcmp(a.first, b.first) < 0; });
  for (const auto& [name, bind] : binders) bind(m);
}
