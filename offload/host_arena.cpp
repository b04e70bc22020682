#include "offload/host_arena.h"

#include <sys/mman.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <sstream>

#include "common/check.h"
#include "offload/io_error.h"
#include "offload/log.h"
#include "offload/pinned_register.h"

namespace zs::offload {

constexpr int64_t kPage = 4096;

struct ArenaState {
  HostArenaOptions options;
  mutable std::mutex mu;
  std::condition_variable released;
  HostArenaStats stats;

  void release(int64_t footprint, bool locked) {
    {
      std::lock_guard<std::mutex> lock(mu);
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

}  // namespace

HostBuffer::~HostBuffer() {
  if (cuda_registered_) cuda_unregister_host(data_);
  if (locked_) ::munlock(data_, static_cast<size_t>(footprint_));
  ::munmap(data_, static_cast<size_t>(footprint_));
  arena_->release(footprint_, locked_);
}

HostArena::HostArena(const HostArenaOptions& options) : state_(std::make_shared<ArenaState>()) {
  ZS_CHECK_VALUE(options.budget_bytes > 0, "host arena: budget must be positive; got ",
                 options.budget_bytes);
  state_->options = options;
  state_->stats.budget = options.budget_bytes;
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
  {
    std::unique_lock<std::mutex> lock(s.mu);
    ZS_CHECK_VALUE(footprint <= s.stats.budget, "host arena: a request for ", bytes, " bytes (",
                   footprint,
                   " page-rounded) exceeds the whole pinned-memory "
                   "budget of ",
                   s.stats.budget, " bytes");
    auto fits = [&] { return s.stats.in_use + footprint <= s.stats.budget; };
    if (!fits()) {
      if (!wait) return nullptr;
      ++s.stats.waits;
      // Clamped so an "infinite" timeout does not overflow the clock arithmetic.
      const auto deadline = std::chrono::duration<double>(std::min(timeout_s, 1e7));
      if (!s.released.wait_for(lock, deadline, fits)) {
        throw std::runtime_error(budget_message(s, footprint, timeout_s));
      }
    }
    // Reserve before the syscalls so concurrent callers see the budget taken.
    s.stats.in_use += footprint;
    s.stats.peak = std::max(s.stats.peak, s.stats.in_use);
    s.stats.allocations += 1;
  }
  void* p = ::mmap(nullptr, static_cast<size_t>(footprint), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    s.release(footprint, true);
    throw IoError(std::string("host arena: mmap of ") + std::to_string(footprint) +
                      " bytes failed: " + std::strerror(err),
                  err);
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
  if (s.options.cuda_register) buf->cuda_registered_ = cuda_register_host(p, footprint);
  return buf;
}

HostArenaStats HostArena::stats() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->stats;
}

int64_t HostArena::budget() const { return stats().budget; }

}  // namespace zs::offload
