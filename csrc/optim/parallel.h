// Splitting one optimizer call over an OpenMP team.
//
// Note [Chunks and alignment]
// One parallel region per call; each thread takes one contiguous chunk and runs it start to
// end, with no barrier inside (libgomp keeps its team alive between regions, so the team is
// persistent and a call costs one fork/join). Chunk edges sit at multiples of 64 elements
// counted from the first element whose param address is 64-byte aligned, so every thread
// but the first starts on a cache line and streams from its first vector, and no two
// threads write the same cache line of any fp32 or 16-bit buffer. Elementwise kernels give
// the same bits for any split, so the result does not depend on the thread count.
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

// Chunk k of `parts` over [0, numel), edges as in Note [Chunks and alignment].
inline int64_t chunk_edge(int64_t numel, int64_t head, int k, int parts) {
  if (k <= 0) return 0;
  if (k >= parts) return numel;
  const int64_t rest = numel - head;
  return head + (rest / parts * k + rest % parts * k / parts) / kChunkQuantum * kChunkQuantum;
}

// Calls fn(begin, end) once per thread over disjoint chunks covering [0, numel).
template <class Fn>
void for_each_chunk(const float* anchor, int64_t numel, int threads, const Fn& fn) {
  if (threads <= 1 || numel == 0) {
    fn(int64_t{0}, numel);
    return;
  }
  const int64_t head = std::min(elements_to_line(anchor), numel);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), parts = omp_get_num_threads();
    const int64_t begin = chunk_edge(numel, head, t, parts);
    const int64_t end = chunk_edge(numel, head, t + 1, parts);
    if (begin < end) fn(begin, end);
  }
}

}  // namespace zs::optim
