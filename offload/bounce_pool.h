// Page-aligned staging buffers for O_DIRECT transfers of buffers that are not 4 KiB
// aligned (torch's allocator gives 64 B alignment). See Note [Bounce buffers].
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

namespace zs::offload {

// Note [Bounce buffers]
// When a request's buffer and file offset are misaligned differently, its body cannot go
// to the device with O_DIRECT from the caller's memory. Instead of the page cache (which
// would hide the device, pollute memory and defer the write), each body piece borrows a
// block-size aligned buffer: writes copy into it before the first attempt, reads copy out
// of it as bytes arrive. A piece keeps its bounce buffer across resubmissions and returns
// it when it finishes, so at most (pieces in flight) buffers exist: threads x queue depth.
// Host-arena buffers are aligned and never bounce (DeepSpeed bounced through a fresh
// mlock'ed allocation per op).
class BouncePool {
 public:
  explicit BouncePool(int64_t buffer_bytes) : bytes_(buffer_bytes) {}
  ~BouncePool();
  BouncePool(const BouncePool&) = delete;
  BouncePool& operator=(const BouncePool&) = delete;

  // A buffer of buffer_bytes() bytes, 4 KiB aligned. Throws std::bad_alloc.
  char* get();
  void put(char* buffer);
  int64_t buffer_bytes() const { return bytes_; }
  int64_t allocated() const;  // buffers created so far (tests)

 private:
  const int64_t bytes_;
  mutable std::mutex mu_;
  std::vector<char*> free_;
  int64_t allocated_ = 0;
};

}  // namespace zs::offload
