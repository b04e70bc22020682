// The host arena: one byte budget for page-locked host memory (DESIGN.md §5). Buffers are
// allocated at their exact size rounded to whole 4 KiB pages (no power-of-two rounding as
// in torch's caching host allocator), page aligned so the same bytes serve O_DIRECT and
// DMA, mlock'ed and, for arenas whose buffers cross to a GPU (`cuda_register`), registered
// with cudaHostRegister when built with CUDA and a GPU is present. A request over the free
// budget waits for a release (backpressure) up to a timeout, then fails with a message that
// names the budget and the request; it never asserts.
//
// Note [Pooled host arenas]
//   Page-locking is a system call per range, and cudaHostRegister a slow one (it pins and
//   maps every page for the GPU): an arena that hands out and takes back buffers during a
//   step (a swap's staging) must not pay it per buffer. A pooled arena maps its whole budget
//   once, locks and registers it once, and carves buffers out of it (best fit, merged on
//   release; ExtentAllocator's bookkeeping). The budget is still counted in bytes, as for
//   an unpooled arena, so fragmentation never makes a request wait that would otherwise
//   fit: such a buffer is mapped and registered on its own (a pool miss, counted). An
//   unpooled arena maps each buffer on its own, which suits buffers made once for the
//   whole run (partitions, masters) and keeps a large budget from being locked up front.
//   Every mapping is MADV_DONTFORK: a forked child (a DataLoader worker) gets none of it,
//   so the kernel never copies pinned pages for it and no child touches DMA memory.
#pragma once

#include <cstdint>
#include <memory>

namespace zs::offload {

struct HostArenaOptions {
  int64_t budget_bytes = int64_t{1} << 30;
  bool lock = true;            // mlock; refused (low `ulimit -l`) → one warning, unlocked
  bool cuda_register = false;  // the buffers cross to a GPU: cudaHostRegister them
  bool pooled = false;         // see Note [Pooled host arenas]
};

struct HostArenaStats {
  int64_t budget = 0;
  int64_t in_use = 0;  // bytes of live buffers (page-rounded)
  int64_t peak = 0;
  int64_t waits = 0;        // allocations that had to wait for a release
  int64_t allocations = 0;  // live buffers
  int64_t unlocked = 0;     // live buffers that could not be mlock'ed
  // Ranges the arena asked to register with CUDA (with or without a GPU present: a pooled
  // arena asks once), how many a GPU accepted, and how many it refused (each refused range
  // stays pageable, which makes every "asynchronous" copy from it synchronous).
  int64_t registrations = 0;
  int64_t registered = 0;
  int64_t register_failed = 0;
  // Pooled: buffers that fitted the budget but no free block of the pool (fragmentation),
  // each mapped (and registered) on its own instead.
  int64_t pool_misses = 0;
};

struct ArenaState;

// One allocation. Its memory returns to the arena when the last owner (a shared_ptr held
// by the caller, or by a DLPack capsule handed to torch) lets go; worker threads only ever
// see the raw pointer.
class HostBuffer {
 public:
  ~HostBuffer();
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  void* data() const { return data_; }
  int64_t size() const { return size_; }            // as requested
  int64_t footprint() const { return footprint_; }  // page-rounded, what the budget counts
  bool locked() const { return locked_; }
  bool cuda_registered() const { return cuda_registered_; }

 private:
  friend class HostArena;
  HostBuffer() = default;
  std::shared_ptr<ArenaState> arena_;
  void* data_ = nullptr;
  int64_t size_ = 0;
  int64_t footprint_ = 0;
  int64_t pool_offset_ = -1;  // a pooled arena's block, or -1: a mapping of its own
  bool locked_ = false;
  bool cuda_registered_ = false;
};

using HostBufferPtr = std::shared_ptr<HostBuffer>;

class HostArena {
 public:
  explicit HostArena(const HostArenaOptions& options);
  ~HostArena();  // buffers still alive keep the arena's bookkeeping alive
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  // Waits up to `timeout_s` for budget. Throws zs::ValueError when `bytes` can never fit
  // the budget, std::runtime_error naming budget, in-use and request on timeout, and
  // IoError when the operating system refuses the memory.
  HostBufferPtr allocate(int64_t bytes, double timeout_s = 60.0);
  // Returns nullptr instead of waiting.
  HostBufferPtr try_allocate(int64_t bytes);

  HostArenaStats stats() const;
  int64_t budget() const;

 private:
  HostBufferPtr allocate_impl(int64_t bytes, double timeout_s, bool wait);
  HostBufferPtr map_buffer(int64_t bytes, int64_t footprint);
  std::shared_ptr<ArenaState> state_;
};

}  // namespace zs::offload
