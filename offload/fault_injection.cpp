#include "offload/fault_injection.h"

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "common/check.h"

namespace zs::offload {
namespace {

struct FaultState {
  std::mutex mu;
  FaultSpec spec;
  std::atomic<bool> armed{false};
  std::atomic<int64_t> attempts{0};
  std::atomic<int64_t> injected{0};
};

int errno_from_name(const std::string& name) {
  static const struct {
    const char* name;
    int value;
  } kNames[] = {{"EIO", EIO},     {"ENOSPC", ENOSPC}, {"EINVAL", EINVAL}, {"EAGAIN", EAGAIN},
                {"EINTR", EINTR}, {"EBADF", EBADF},   {"EFAULT", EFAULT}, {"ENOMEM", ENOMEM},
                {"EROFS", EROFS}, {"EDQUOT", EDQUOT}, {"EFBIG", EFBIG},   {"ENXIO", ENXIO}};
  for (const auto& n : kNames) {
    if (name == n.name) return n.value;
  }
  char* end = nullptr;
  const long v = std::strtol(name.c_str(), &end, 10);
  if (end && *end == '\0' && v > 0 && v < 4096) return static_cast<int>(v);
  return 0;
}

FaultState& state() {
  static FaultState* s = [] {
    auto* st = new FaultState();
    if (const char* env = std::getenv("ZS_IO_FAULT"); env && *env) {
      st->spec = parse_fault_spec(env);
      st->armed = st->spec.nth > 0;
    }
    return st;
  }();
  return *s;
}

}  // namespace

FaultSpec parse_fault_spec(const std::string& text) {
  const std::string usage =
      "ZS_IO_FAULT: expected <nth>:<errno name|number|short>[:every], e.g. 3:EIO; got \"" + text +
      "\"";
  FaultSpec spec;
  const size_t c1 = text.find(':');
  ZS_CHECK_VALUE(c1 != std::string::npos, usage);
  char* end = nullptr;
  spec.nth = std::strtoll(text.c_str(), &end, 10);
  ZS_CHECK_VALUE(end == text.c_str() + c1 && spec.nth > 0, usage);
  std::string what = text.substr(c1 + 1);
  const size_t c2 = what.find(':');
  if (c2 != std::string::npos) {
    ZS_CHECK_VALUE(what.substr(c2 + 1) == "every", usage);
    spec.every = true;
    what = what.substr(0, c2);
  }
  if (what == "short") {
    spec.short_transfer = true;
  } else {
    spec.err = errno_from_name(what);
    ZS_CHECK_VALUE(spec.err > 0, usage);
  }
  return spec;
}

void set_io_fault(const FaultSpec& spec) {
  FaultState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.spec = spec;
  s.attempts = 0;
  s.injected = 0;
  s.armed = spec.nth > 0;
}

void clear_io_fault() { set_io_fault(FaultSpec{}); }

int64_t io_faults_injected() { return state().injected.load(); }

FaultAction next_io_fault(int64_t length, int64_t align) {
  FaultAction action{0, length};
  FaultState& s = state();
  if (!s.armed.load(std::memory_order_relaxed)) return action;
  FaultSpec spec;
  int64_t n = 0;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    spec = s.spec;
    n = ++s.attempts;
  }
  const bool hit = spec.every ? (n % spec.nth == 0) : (n == spec.nth);
  if (!hit) return action;
  if (!spec.short_transfer) {
    ++s.injected;
    action.err = spec.err;
    return action;
  }
  const int64_t shorter = (length / 2) / align * align;
  if (shorter <= 0) return action;  // too small to shorten and stay aligned
  ++s.injected;
  action.length = shorter;
  return action;
}

}  // namespace zs::offload
