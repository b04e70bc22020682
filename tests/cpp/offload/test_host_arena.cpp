// The host arena: page-aligned exact-size buffers under one budget; over-budget requests
// wait for a release, time out with a message naming budget and request, and a refused
// mlock (low ulimit -l) degrades to unlocked memory with a warning.
#include <linux/capability.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

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
  for (bool pooled : {false, true}) {
    HostBufferPtr keep;
    {
      HostArenaOptions o = budget(1 << 20);
      o.pooled = pooled;
      HostArena arena(o);
      keep = arena.allocate(4096);
    }
    // Still mapped (a pooled arena's mapping lives as long as one of its buffers).
    std::memset(keep->data(), 0x3C, 4096);
    EXPECT_EQ(static_cast<unsigned char*>(keep->data())[4095], 0x3C) << "pooled " << pooled;
    keep.reset();  // releases into the arena's surviving bookkeeping
  }
}

TEST(offload_HostArena, UnpooledArenaRegistersEachBufferOnlyWhenAskedTo) {
  HostArenaOptions o = budget(1 << 20);
  HostArena disk_only(o);
  auto a = disk_only.allocate(8192);
  EXPECT_EQ(disk_only.stats().registrations, 0);
  o.cuda_register = true;
  HostArena dma(o);
  auto b = dma.allocate(4096);
  auto c = dma.allocate(4096);
  HostArenaStats s = dma.stats();
  EXPECT_EQ(s.registrations, 2);  // one per buffer (with or without a GPU here)
  EXPECT_EQ(s.register_failed, 0);
  EXPECT_EQ(s.registered + s.register_failed, b->cuda_registered() + c->cuda_registered());
}

TEST(offload_HostArena, PooledArenaMapsAndRegistersItsBudgetOnce) {
  HostArenaOptions o = budget(1 << 20);
  o.pooled = true;
  o.cuda_register = true;
  HostArena arena(o);
  EXPECT_EQ(arena.stats().registrations, 1);  // at construction, the whole pool
  std::vector<HostBufferPtr> held;
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  for (int round = 0; round < 20; ++round) {
    held.clear();
    for (int i = 0; i < 4; ++i) {
      held.push_back(arena.allocate(64 << 10));
      const auto p = reinterpret_cast<uintptr_t>(held.back()->data());
      EXPECT_EQ(p % 4096, 0u);
      lo = std::min(lo, p);
      hi = std::max(hi, p + (64 << 10));
      std::memset(held.back()->data(), i, 64 << 10);  // the pages are ours to write
    }
  }
  HostArenaStats s = arena.stats();
  EXPECT_EQ(s.registrations, 1) << "a pooled arena never registers per buffer";
  EXPECT_EQ(s.allocations, 4);
  EXPECT_EQ(s.in_use, 4 * (64 << 10));
  EXPECT_LE(hi - lo, 1u << 20);  // every buffer inside the one mapping
  EXPECT_TRUE(held[0]->locked());
}

TEST(offload_HostArena, PooledArenaReusesFreedBlocksAndMapsWhatFragmentationLeavesOut) {
  HostArenaOptions o = budget(256 << 10);
  o.pooled = true;
  o.cuda_register = true;
  HostArena arena(o);
  auto a = arena.allocate(64 << 10);
  auto b = arena.allocate(64 << 10);
  auto c = arena.allocate(64 << 10);
  auto d = arena.allocate(64 << 10);
  void* second = b->data();
  b.reset();
  auto e = arena.try_allocate(64 << 10);  // best fit: b's block again
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->data(), second);
  e.reset();
  d.reset();
  // 128 KiB are free, but in two places: the request fits the budget, not one block, so
  // it gets a mapping of its own rather than waiting for a neighbour to be freed.
  auto f = arena.try_allocate(128 << 10);
  ASSERT_NE(f, nullptr);
  const auto lo = reinterpret_cast<uintptr_t>(a->data());
  const auto p = reinterpret_cast<uintptr_t>(f->data());
  EXPECT_TRUE(p + (128 << 10) <= lo || p >= lo + (256 << 10)) << "outside the pool";
  std::memset(f->data(), 9, 128 << 10);
  HostArenaStats s = arena.stats();
  EXPECT_EQ(s.pool_misses, 1);
  EXPECT_EQ(s.registrations, 2);  // the pool, and the miss
  EXPECT_EQ(s.in_use, 4 * (64 << 10));
  // Over the budget in bytes it waits, as any arena does, until a release.
  std::thread freer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    c.reset();
  });
  auto g = arena.allocate(64 << 10, 30.0);
  freer.join();
  EXPECT_NE(g, nullptr);
  EXPECT_EQ(arena.stats().waits, 1);
  f.reset();  // a miss's mapping goes back to the system
  EXPECT_EQ(arena.stats().in_use, 2 * (64 << 10));
}

TEST(offload_HostArena, ForkedChildrenDoNotInheritArenaMemory) {
  for (bool pooled : {false, true}) {
    HostArenaOptions o = budget(1 << 20);
    o.pooled = pooled;
    HostArena arena(o);
    auto buf = arena.allocate(64 << 10);
    std::memset(buf->data(), 1, 64 << 10);
    const pid_t pid = fork();
    if (pid == 0) {
      // MADV_DONTFORK: the range is not mapped here, so mincore says ENOMEM.
      unsigned char vec[16];
      const int rc = mincore(buf->data(), 4096, vec);
      _exit(rc == -1 && errno == ENOMEM ? 0 : 1);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "pooled " << pooled;
  }
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
