// Caching allocator of the CPU kernels' buffers (policy in buffer_cache.h).
#include "buffer_cache.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <unordered_map>

namespace fastenc_cpu {
namespace {

constexpr size_t kPage = 4096;

struct Cache {
  struct Free {
    void* p;
    uint64_t stamp;  // when it was freed: the oldest go first when memory is trimmed
  };
  std::mutex mu;
  std::multimap<size_t, Free> free_blocks;       // size -> cached block
  std::unordered_map<void*, size_t> block_size;  // every block, in use or cached
  int64_t in_use = 0, cached = 0, peak = 0, hits = 0, misses = 0;
  uint64_t clock = 0;

  void drop(std::multimap<size_t, Free>::iterator it) {
    block_size.erase(it->second.p);
    std::free(it->second.p);
    cached -= (int64_t)it->first;
    free_blocks.erase(it);
  }
  void release_all() {
    while (!free_blocks.empty()) drop(free_blocks.begin());
  }
  // Release the least recently freed blocks until in_use + cached + incoming <= limit.
  void trim(int64_t incoming, int64_t limit) {
    while (!free_blocks.empty() && in_use + cached + incoming > limit) {
      auto oldest = free_blocks.begin();
      for (auto it = free_blocks.begin(); it != free_blocks.end(); ++it)
        if (it->second.stamp < oldest->second.stamp) oldest = it;
      drop(oldest);
    }
  }
};

Cache& cache() {
  static Cache* c = new Cache();  // never destroyed: tensors freed during interpreter exit still return here
  return *c;
}

}  // namespace

void* cache_alloc(size_t bytes) {
  const size_t size = (bytes + kPage - 1) / kPage * kPage;
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  ++c.clock;
  auto it = c.free_blocks.lower_bound(size);
  if (it != c.free_blocks.end() && it->first <= size + size / 4) {
    void* p = it->second.p;
    c.cached -= (int64_t)it->first;
    c.in_use += (int64_t)it->first;
    c.free_blocks.erase(it);
    ++c.hits;
    if (c.in_use > c.peak) c.peak = c.in_use;
    return p;
  }
  ++c.misses;
  const int64_t need = c.in_use + (int64_t)size;
  const int64_t peak = need > c.peak ? need : c.peak;
  c.trim((int64_t)size, 2 * peak);
  void* p = std::aligned_alloc(64, size);
  if (p == nullptr) {  // retry once with nothing cached
    c.release_all();
    p = std::aligned_alloc(64, size);
    if (p == nullptr) throw std::bad_alloc();
  }
  c.block_size[p] = size;
  c.in_use += (int64_t)size;
  if (c.in_use > c.peak) c.peak = c.in_use;
  return p;
}

void cache_free(void* p) {
  if (p == nullptr) return;
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.block_size.find(p);
  if (it == c.block_size.end()) {  // not a cached block (cannot happen through the bindings)
    std::free(p);
    return;
  }
  c.in_use -= (int64_t)it->second;
  c.cached += (int64_t)it->second;
  c.free_blocks.emplace(it->second, Cache::Free{p, ++c.clock});
}

void cache_release() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.release_all();
  c.peak = c.in_use;  // the trim limit starts again from what is in use now
}

CacheStats cache_stats() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return {c.in_use, c.cached, c.peak, c.hits, c.misses};
}

}  // namespace fastenc_cpu
