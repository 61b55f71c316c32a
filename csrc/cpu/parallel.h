// When the C++/OpenMP CPU kernels open a parallel region. A fork/join costs a few microseconds on an idle machine
// and, on a busy one, up to a scheduler time slice (milliseconds) when a worker thread has been descheduled: the
// whole region waits for its slowest thread. Below the thresholds here one thread finishes before a team would
// have started, so the kernel runs on the calling thread (OpenMP `if` clause: a team of one, same code path).
//
// How the numbers were chosen (bench/omp_threshold.py, fp32, 2 cores under load ~14): one thread spends ~1.4 ns
// of CPU time per output element on LayerNorm + residual and ~1.1 ns on exact GELU + bias (4096-row calls), less
// on an idle core, so 2^16 elements is ~40-90 us on one thread: the size from which a second thread can save more
// than a fork/join risks. Below it, 2 threads cost 13-50x the 1-thread wall time (16 x 3072 GELU, 16 x 768 norm);
// with it both run at 1.0-1.25x. BERT-base at 16 tokens (16 x 768 norms, 16 x 3072 GELU) stays serial;
// 4096-token batches stay parallel.
#pragma once
#include <cstdint>

namespace fastenc_cpu {

// Output elements per call below which the row / elementwise kernels (norms and their backward, GELU, GeGLU and
// their backward, RoPE) run serially.
constexpr int64_t kParallelMinElems = int64_t(1) << 16;

// Multiply-adds per call below which merge_lora runs serially (its inner loop runs at several FMAs per ns, and
// its row blocks are coarse: a small merge gains nothing from a second thread).
constexpr int64_t kParallelMinFmas = int64_t(1) << 24;

// Multiply-adds per call (sum over (sequence, head) of query rows x keys seen x head_dim, for S = Q K^T and again for
// P V) below which the attention kernels (forward and backward) run serially. A batch-1 short query (12 heads x
// 16 x 16 tokens x 64: 2^18.6) is tens of microseconds of one thread's work; 1 x 128 tokens (2^24.6) is not.
// 2^20 is ~50-100 us on one core (the kernel runs at ~10-20 GFMA/s per thread at these sizes), the scale from
// which the ops above also open a team.
constexpr int64_t kParallelMinAttnFmas = int64_t(1) << 20;

// Multiply-adds per call below which the packed-panel GEMM (gemm.cpp) runs serially: 2^22 is ~100 us of one
// core at its ~40-80 GFLOP/s (MiniLM's 16 x 384 x 384 projections, 2^21.2, stay serial; its 16 x 384 x 1536 MLP
// GEMMs and every BERT-base GEMM at 16 rows split their column panels over the team).
constexpr int64_t kParallelMinGemmFmas = int64_t(1) << 22;

// Whether `work` units justify a team, against one of the thresholds above.
inline bool worth_parallel(int64_t work, int64_t threshold) { return work >= threshold; }

}  // namespace fastenc_cpu
