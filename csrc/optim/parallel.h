// Splitting one optimizer call (one buffer or a list of them) over an OpenMP team.
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
//
// Note [Many tensors, one region]
// An optimizer over a model's parameter list steps many tensors per call (GPT-2 small: 148,
// most of them 768-element biases and norms). One region per tensor pays a fork/join and,
// worse, the tail of every region: the last chunk runs while the other thread waits. One
// region over the chunks of every tensor pays both once (see benchmarks/optim.md for the
// measured gain). Small tensors become one chunk each, so two threads step two of them at
// once instead of one thread stepping each alone. Items that are views of one flat buffer
// can share the cache line at their boundary, which two threads may then both write: the
// results are the same, it only costs that line's false sharing.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace zs::optim {

constexpr int64_t kChunkQuantum = 64;

// Elements of `width` bytes before `p` reaches a 64-byte boundary (0 when p is not even
// element-aligned).
inline int64_t elements_to_line(const void* p, int width = 4) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  if (addr % width != 0) return 0;
  return static_cast<int64_t>((64 - addr % 64) % 64 / width);
}

// Chunks of about kChunkTarget elements, at least 8 per thread so the shares even out.
constexpr int64_t kChunkTarget = int64_t{1} << 18;

inline int64_t chunk_size(int64_t numel, int threads) {
  const int64_t per_thread = numel / (8 * static_cast<int64_t>(threads));
  const int64_t size = std::min(kChunkTarget, std::max(per_thread, kChunkQuantum));
  return (size + kChunkQuantum - 1) / kChunkQuantum * kChunkQuantum;
}

// One piece of work: elements [begin, end) of item `item`.
struct ItemChunk {
  int64_t item, begin, end;
};

// The chunks of items 0..count-1 (anchors[i]: item i's param pointer, widths[i] its element
// size, 4 where widths is null; numels[i]: its size), cut with one chunk size for the whole
// list: per item, the unaligned head, then chunks from its first 64-byte aligned param on.
inline std::vector<ItemChunk> plan_chunks(const void* const* anchors, const int* widths,
                                          const int64_t* numels, int64_t count, int threads) {
  int64_t total = 0;
  for (int64_t i = 0; i < count; ++i) total += numels[i];
  const int64_t size = chunk_size(total, threads);
  std::vector<ItemChunk> chunks;
  chunks.reserve(static_cast<size_t>(2 * count + total / size + 1));
  for (int64_t i = 0; i < count; ++i) {
    const int64_t n = numels[i];
    const int width = widths == nullptr ? 4 : widths[i];
    const int64_t head = std::min(elements_to_line(anchors[i], width), n);
    if (head > 0) chunks.push_back({i, 0, head});
    for (int64_t b = head; b < n; b += size) chunks.push_back({i, b, std::min(n, b + size)});
  }
  return chunks;
}

// Calls fn(item, begin, end) over disjoint chunks covering every item, from up to `threads`
// threads in one parallel region (Notes [Chunks and alignment], [Many tensors, one region]).
template <class Fn>
void for_each_item_chunk(const void* const* anchors, const int* widths, const int64_t* numels,
                         int64_t count, int threads, const Fn& fn) {
  if (threads <= 1) {
    for (int64_t i = 0; i < count; ++i) {
      if (numels[i] > 0) fn(i, int64_t{0}, numels[i]);
    }
    return;
  }
  const std::vector<ItemChunk> chunks = plan_chunks(anchors, widths, numels, count, threads);
  const auto n = static_cast<int64_t>(chunks.size());
#pragma omp parallel num_threads(threads)
  {
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t k = 0; k < n; ++k) fn(chunks[k].item, chunks[k].begin, chunks[k].end);
  }
}

// Calls fn(begin, end) over disjoint chunks covering [0, numel) of one buffer of `width`-byte
// elements.
template <class Fn>
void for_each_chunk(const void* anchor, int64_t numel, int threads, const Fn& fn, int width = 4) {
  for_each_item_chunk(&anchor, &width, &numel, 1, threads,
                      [&](int64_t, int64_t begin, int64_t end) { fn(begin, end); });
}

}  // namespace zs::optim
