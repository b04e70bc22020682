// The host arena: page-aligned exact-size buffers under one budget; over-budget requests
// wait for a release, time out with a message naming budget and request, and a refused
// mlock (low ulimit -l) degrades to unlocked memory with a warning.
#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "common/check.h"
#include "offload/host_arena.h"
#include "offload/log.h"
#include "offload_test_util.h"

namespace zs::offload {
namespace {

HostArenaOptions budget(int64_t bytes) {
  HostArenaOptions o;
  o.budget_bytes = bytes;
  return o;
}

TEST(offload_HostArena, BuffersArePageAlignedExactSizedAndCounted) {
  HostArena arena(budget(64 << 20));
  auto a = arena.allocate(1);
  auto b = arena.allocate((3 << 20) + 5);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data()) % 4096, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % 4096, 0u);
  EXPECT_EQ(b->size(), (3 << 20) + 5);
  EXPECT_EQ(b->footprint(), (3 << 20) + 4096);  // page-rounded, not a power of two
  std::memset(b->data(), 0x5A, static_cast<size_t>(b->size()));
  EXPECT_TRUE(b->locked());  // root here: CAP_IPC_LOCK
  HostArenaStats s = arena.stats();
  EXPECT_EQ(s.in_use, 4096 + (3 << 20) + 4096);
  EXPECT_EQ(s.allocations, 2);
  b.reset();
  s = arena.stats();
  EXPECT_EQ(s.in_use, 4096);
  EXPECT_EQ(s.peak, 4096 + (3 << 20) + 4096);
}

TEST(offload_HostArena, OverBudgetRequestWaitsForARelease) {
  HostArena arena(budget(1 << 20));
  auto held = arena.allocate(768 << 10);
  EXPECT_EQ(arena.try_allocate(512 << 10), nullptr);
  std::atomic<bool> got{false};
  std::thread waiter([&] {
    auto b = arena.allocate(512 << 10, 30.0);
    got = b != nullptr;
  });
  // The waiter cannot proceed while `held` lives; give it time to block, then release.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(got.load());
  held.reset();
  waiter.join();
  EXPECT_TRUE(got.load());
  EXPECT_EQ(arena.stats().waits, 1);
  EXPECT_EQ(arena.stats().in_use, 0);
}

TEST(offload_HostArena, TimeoutNamesTheBudgetAndTheRequest) {
  HostArena arena(budget(1 << 20));
  auto held = arena.allocate(1 << 20);
  try {
    arena.allocate(8192, 0.05);
    FAIL() << "expected a timeout";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("8192 bytes"), std::string::npos) << what;
    EXPECT_NE(what.find("budget of 1048576"), std::string::npos) << what;
  }
  EXPECT_THROW(arena.allocate((1 << 20) + 1), ValueError);  // can never fit
}

TEST(offload_HostArena, BuffersOutliveTheArenaObject) {
  HostBufferPtr keep;
  {
    HostArena arena(budget(1 << 20));
    keep = arena.allocate(4096);
  }
  std::memset(keep->data(), 1, 4096);
  keep.reset();  // releases into the arena's surviving bookkeeping
}

// Without CAP_IPC_LOCK and with RLIMIT_MEMLOCK at 64 KiB, mlock of 1 MiB fails: the
// arena must hand out unlocked memory and warn once. Runs in a child (death-test fork)
// because dropping a capability cannot be undone.
[[noreturn]] void allocate_without_memlock() {
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  syscall(SYS_capget, &hdr, data);
  data[0].effective &= ~(1u << CAP_IPC_LOCK);
  syscall(SYS_capset, &hdr, data);
  rlimit lim{64 << 10, 64 << 10};
  setrlimit(RLIMIT_MEMLOCK, &lim);
  HostArena arena(budget(8 << 20));
  auto a = arena.allocate(1 << 20);
  auto b = arena.allocate(1 << 20);
  std::memset(a->data(), 7, 1 << 20);
  int mlock_warnings = 0;
  for (const auto& w : warnings_emitted()) mlock_warnings += w.find("mlock") != w.npos;
  const bool ok = !a->locked() && !b->locked() && arena.stats().unlocked == 2 &&
                  mlock_warnings == 1;
  std::exit(ok ? 0 : 1);
}

TEST(offload_HostArenaDeathTest, LowMemlockLimitDegradesToUnlockedMemoryWithOneWarning) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers (ASan, TSan) replace mlock with a no-op that always succeeds";
#endif
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(allocate_without_memlock(), ::testing::ExitedWithCode(0), "mlock refused");
}

}  // namespace
}  // namespace zs::offload
