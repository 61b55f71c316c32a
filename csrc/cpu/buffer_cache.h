// A caching allocator for the CPU kernels' large outputs and working buffers (no torch headers): freed blocks are
// kept and handed out again, so a model's forward, whose layers repeat the same few buffer sizes, touches fresh
// pages only in its first layer and not at all in a repeated call. Without it each big torch allocation goes back
// to the kernel on free (glibc trims or unmaps it) and is faulted in and zeroed again by the next layer: on a
// 2-core machine BERT-base at 8 x 128 took 20k-75k page faults per forward.
//
// Policy: a request is rounded up to 4 KiB and served by the smallest cached block at most 1/4 larger. On a miss,
// if in-use + cached + new bytes would pass twice the peak ever in use, the least recently freed blocks are released
// until it does not (blocks of shapes no longer seen go first), so memory held stays within twice the largest set
// of buffers a forward had in use at one time. cache_release() (fastenc.empty_cache()) frees all cached blocks.
// Thread-safe.
#pragma once
#include <cstddef>
#include <cstdint>

namespace fastenc_cpu {

// Requests below this many bytes are not cached (glibc serves them from its arenas without page faults).
constexpr size_t kCacheMinBytes = 64 * 1024;

// 64-byte aligned block of at least `bytes`; throws std::bad_alloc on failure.
void* cache_alloc(size_t bytes);
// Return a block from cache_alloc (kept for reuse).
void cache_free(void* p);
// Release every cached (not in use) block to the system; the peak in use restarts from what is in use now.
void cache_release();

struct CacheStats {
  int64_t in_use_bytes, cached_bytes, peak_bytes, hits, misses;
};
CacheStats cache_stats();

}  // namespace fastenc_cpu
