// Splitting one optimizer call over an OpenMP team.
//
// Note [Chunks and alignment]
// One parallel region per call, no barrier inside it: threads take chunks from a shared
// counter (OpenMP dynamic schedule, nowait) and run each start to end. libgomp keeps its
// team alive between regions, so the team is persistent and a call costs one fork/join.
// Taking chunks instead of one fixed share per thread matters on shared machines: when a
// thread is descheduled, the others take its work instead of waiting for it at the join.
// Chunk edges sit at multiples of kChunkQuantum elements counted from the first element
// whose param address is 64-byte aligned, so every chunk but the first starts on a cache
// line and no two threads write the same line of any fp32 or 16-bit buffer. Elementwise
// kernels give the same bits for any split, so results do not depend on the thread count
// or on which thread ran which chunk.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace zs::optim {

constexpr int64_t kChunkQuantum = 64;

// Elements before `p + i` reaches a 64-byte boundary (0 when p is not even 4-byte aligned).
inline int64_t elements_to_line(const float* p) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  if (addr % 4 != 0) return 0;
  return static_cast<int64_t>((64 - addr % 64) % 64 / 4);
}

// Chunks of about kChunkTarget elements, at least 8 per thread so the shares even out.
constexpr int64_t kChunkTarget = int64_t{1} << 18;

inline int64_t chunk_size(int64_t numel, int threads) {
  const int64_t per_thread = numel / (8 * static_cast<int64_t>(threads));
  const int64_t size = std::min(kChunkTarget, std::max(per_thread, kChunkQuantum));
  return (size + kChunkQuantum - 1) / kChunkQuantum * kChunkQuantum;
}

// Calls fn(begin, end) over disjoint chunks covering [0, numel), from up to `threads`
// threads (Note [Chunks and alignment]).
template <class Fn>
void for_each_chunk(const float* anchor, int64_t numel, int threads, const Fn& fn) {
  if (threads <= 1 || numel == 0) {
    fn(int64_t{0}, numel);
    return;
  }
  const int64_t head = std::min(elements_to_line(anchor), numel);
  const int64_t size = chunk_size(numel - head, threads);
  const int64_t chunks = (numel - head + size - 1) / size;
#pragma omp parallel num_threads(threads)
  {
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t k = 0; k <= chunks; ++k) {
      // Chunk 0 is the unaligned head (possibly empty); chunk k covers head + (k-1)*size.
      const int64_t begin = k == 0 ? 0 : head + (k - 1) * size;
      const int64_t end = k == 0 ? head : std::min(numel, begin + size);
      if (begin < end) fn(begin, end);
    }
  }
}

}  // namespace zs::optim
