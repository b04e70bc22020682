#include "offload/host_arena.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <sstream>

#include "common/check.h"
#include "offload/extent_allocator.h"
#include "offload/io_error.h"
#include "offload/log.h"
#include "offload/pinned_register.h"

namespace zs::offload {

constexpr int64_t kPage = 4096;

namespace {

// mlock may be refused by RLIMIT_MEMLOCK (`ulimit -l`) without CAP_IPC_LOCK: the memory is
// still correct, only swappable, so degrade with one warning instead of failing.
bool lock_pages(void* p, int64_t bytes) {
  if (::mlock(p, static_cast<size_t>(bytes)) == 0) return true;
  const int err = errno;
  warn_once("mlock", std::string("host arena: mlock refused (") + std::strerror(err) +
                         "); using unlocked memory. Raise `ulimit -l` (memlock) to pin "
                         "offload buffers.");
  return false;
}

// A private anonymous mapping that forked children do not inherit (Note [Pooled host
// arenas]); throws IoError when the system refuses the memory.
void* map_pages(int64_t bytes) {
  void* p = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    throw IoError(std::string("host arena: mmap of ") + std::to_string(bytes) +
                      " bytes failed: " + std::strerror(err),
                  err);
  }
  ::madvise(p, static_cast<size_t>(bytes), MADV_DONTFORK);  // advisory: a no-op if refused
  return p;
}

}  // namespace

struct ArenaState {
  HostArenaOptions options;
  mutable std::mutex mu;
  std::condition_variable released;
  HostArenaStats stats;
  // A pooled arena's one mapping and its free space (Note [Pooled host arenas]).
  void* pool = nullptr;
  int64_t pool_bytes = 0;
  bool pool_locked = false;
  bool pool_registered = false;
  std::unique_ptr<ExtentAllocator> blocks;

  ~ArenaState() {
    if (pool == nullptr) return;
    if (pool_registered) cuda_unregister_host(pool);
    if (pool_locked) ::munlock(pool, static_cast<size_t>(pool_bytes));
    ::munmap(pool, static_cast<size_t>(pool_bytes));
  }

  // Asks CUDA to register a range (if the arena's buffers cross to a GPU); counted. Call
  // without `mu` held.
  bool register_range(void* p, int64_t bytes) {
    if (!options.cuda_register) return false;
    const Registration r = cuda_register_host(p, static_cast<size_t>(bytes));
    std::lock_guard<std::mutex> lock(mu);
    stats.registrations += 1;
    stats.registered += r == Registration::kRegistered;
    stats.register_failed += r == Registration::kFailed;
    return r == Registration::kRegistered;
  }

  // Takes `footprint` bytes of the budget (and, pooled, a block: its offset in `*offset`,
  // or -1 when the free pool space is too fragmented to hold it: the buffer then gets a
  // mapping of its own, so a pooled arena never waits where an unpooled one would not);
  // false when they do not fit now. Call with `mu` held.
  bool take(int64_t footprint, int64_t* offset) {
    if (stats.in_use + footprint > stats.budget) return false;
    *offset = -1;
    if (blocks) {
      const ExtentAllocator::Plan plan = blocks->plan(footprint);
      if (plan.new_file_end <= pool_bytes) {
        blocks->commit(plan);
        *offset = plan.extent.offset;
      } else {
        stats.pool_misses += 1;
      }
    }
    stats.in_use += footprint;
    stats.peak = std::max(stats.peak, stats.in_use);
    stats.allocations += 1;
    return true;
  }

  void release(int64_t footprint, int64_t offset, bool locked) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (offset >= 0) blocks->release(Extent{0, offset, footprint});
      stats.in_use -= footprint;
      stats.allocations -= 1;
      if (!locked) stats.unlocked -= 1;
    }
    released.notify_all();
  }
};

namespace {

std::string budget_message(const ArenaState& s, int64_t footprint, double timeout_s) {
  std::ostringstream os;
  os << "host arena: a request for " << footprint << " bytes did not fit the pinned-memory "
     << "budget of " << s.stats.budget << " bytes (" << s.stats.in_use << " in use in "
     << s.stats.allocations << " buffers, peak " << s.stats.peak << ") within " << timeout_s
     << " s. Release buffers sooner or raise the budget.";
  return os.str();
}

}  // namespace

HostBuffer::~HostBuffer() {
  if (pool_offset_ < 0) {
    if (cuda_registered_) cuda_unregister_host(data_);
    if (locked_) ::munlock(data_, static_cast<size_t>(footprint_));
    ::munmap(data_, static_cast<size_t>(footprint_));
  }
  arena_->release(footprint_, pool_offset_, locked_);
}

HostArena::HostArena(const HostArenaOptions& options) : state_(std::make_shared<ArenaState>()) {
  ZS_CHECK_VALUE(options.budget_bytes > 0, "host arena: budget must be positive; got ",
                 options.budget_bytes);
  ArenaState& s = *state_;
  s.options = options;
  s.stats.budget = options.budget_bytes;
  if (options.pooled) {
    s.pool_bytes = (options.budget_bytes + kPage - 1) / kPage * kPage;
    s.pool = map_pages(s.pool_bytes);
    s.pool_locked = options.lock && lock_pages(s.pool, s.pool_bytes);
    s.pool_registered = s.register_range(s.pool, s.pool_bytes);
    s.blocks = std::make_unique<ExtentAllocator>(1, kPage);
  }
}

HostArena::~HostArena() = default;

HostBufferPtr HostArena::allocate(int64_t bytes, double timeout_s) {
  return allocate_impl(bytes, timeout_s, true);
}

HostBufferPtr HostArena::try_allocate(int64_t bytes) { return allocate_impl(bytes, 0, false); }

HostBufferPtr HostArena::allocate_impl(int64_t bytes, double timeout_s, bool wait) {
  ZS_CHECK_VALUE(bytes >= 0, "host arena: negative allocation size ", bytes);
  const int64_t footprint = std::max<int64_t>(kPage, (bytes + kPage - 1) / kPage * kPage);
  ArenaState& s = *state_;
  int64_t offset = -1;
  {
    std::unique_lock<std::mutex> lock(s.mu);
    ZS_CHECK_VALUE(footprint <= s.stats.budget, "host arena: a request for ", bytes, " bytes (",
                   footprint,
                   " page-rounded) exceeds the whole pinned-memory "
                   "budget of ",
                   s.stats.budget, " bytes");
    // Reserved before any system call so concurrent callers see the budget taken.
    if (!s.take(footprint, &offset)) {
      if (!wait) return nullptr;
      ++s.stats.waits;
      // Clamped so an "infinite" timeout does not overflow the clock arithmetic.
      const auto deadline = std::chrono::duration<double>(std::min(timeout_s, 1e7));
      if (!s.released.wait_for(lock, deadline, [&] { return s.take(footprint, &offset); })) {
        throw std::runtime_error(budget_message(s, footprint, timeout_s));
      }
    }
  }
  if (offset < 0) return map_buffer(bytes, footprint);
  auto buf = std::shared_ptr<HostBuffer>(new HostBuffer());
  buf->arena_ = state_;
  buf->data_ = static_cast<char*>(s.pool) + offset;
  buf->size_ = bytes;
  buf->footprint_ = footprint;
  buf->pool_offset_ = offset;
  buf->locked_ = s.pool_locked;
  buf->cuda_registered_ = s.pool_registered;
  if (!buf->locked_) {
    std::lock_guard<std::mutex> lock(s.mu);
    s.stats.unlocked += 1;
  }
  return buf;
}

HostBufferPtr HostArena::map_buffer(int64_t bytes, int64_t footprint) {
  ArenaState& s = *state_;
  void* p = nullptr;
  try {
    p = map_pages(footprint);
  } catch (...) {
    s.release(footprint, -1, true);
    throw;
  }
  auto buf = std::shared_ptr<HostBuffer>(new HostBuffer());
  buf->arena_ = state_;
  buf->data_ = p;
  buf->size_ = bytes;
  buf->footprint_ = footprint;
  buf->locked_ = s.options.lock && lock_pages(p, footprint);
  if (!buf->locked_) {
    std::lock_guard<std::mutex> lock(s.mu);
    s.stats.unlocked += 1;
  }
  buf->cuda_registered_ = s.register_range(p, footprint);
  return buf;
}

HostArenaStats HostArena::stats() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->stats;
}

int64_t HostArena::budget() const { return stats().budget; }

}  // namespace zs::offload
