// When the C++/OpenMP CPU kernels open a parallel region. A fork/join costs a few microseconds on an idle machine
// and, on a busy one, up to a scheduler time slice (milliseconds) when a worker thread has been descheduled: the
// whole region waits for its slowest thread. Below the thresholds here one thread finishes before a team would
// have started, so the kernel runs on the calling thread (OpenMP `if` clause: a team of one, same code path).
//
// How the numbers were chosen (one thread, -O3 -march=native, fp32, bench/omp_threshold.py): LayerNorm + residual
// runs at ~0.5-1 ns per output element and exact GELU + bias at ~1-1.5 ns, so 2^16 output elements is ~30-100 us
// on one thread -- the point below which a 2-thread team saved less than it risked on a loaded 2-core machine.
// BERT-base at 16 tokens (16 x 768 norms, 16 x 3072 GELU) stays serial; 4096-token batches stay parallel.
#pragma once
#include <cstdint>

namespace fastenc_cpu {

// Output elements per call below which the row / elementwise kernels (norms and their backward, GELU, GeGLU and
// their backward, RoPE) run serially.
constexpr int64_t kParallelMinElems = int64_t(1) << 16;

// Multiply-adds per call below which merge_lora runs serially (its inner loop runs at several FMAs per ns, and
// its row blocks are coarse: a small merge gains nothing from a second thread).
constexpr int64_t kParallelMinFmas = int64_t(1) << 24;

// Whether `work` units justify a team, against one of the thresholds above.
inline bool worth_parallel(int64_t work, int64_t threshold) { return work >= threshold; }

}  // namespace fastenc_cpu
