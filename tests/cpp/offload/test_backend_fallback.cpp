// aio.backend "auto" falls back to the thread pool when io_uring cannot be set up, and an
// explicit "io_uring" fails with a clear error. io_uring_setup is blocked for real, with a
// seccomp filter in a forked child (as container runtimes do), not with a flag.
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>

#include "offload/io_engine.h"
#include "offload/io_error.h"
#include "offload/io_probe.h"
#include "offload/log.h"
#include "offload_test_util.h"

namespace zs::offload {
namespace {

bool block_io_uring_setup() {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog prog{static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])), filter};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

bool fallback_works() {
  testing::ScratchDir dir;  // destroyed before the child exits (exit does not unwind)
  // The probe ("auto", `zerostream report`, test skips) names the refused call.
  const std::string why = probe_io_uring();
  const bool probe_refused = why.find("io_uring_queue_init") != std::string::npos &&
                             why.find(std::strerror(EPERM)) != std::string::npos;
  // Explicit io_uring: an IoError that says what failed.
  bool explicit_failed = false;
  try {
    make_io_engine(testing::test_config(IoBackend::kIoUring));
  } catch (const IoError& e) {
    explicit_failed = std::strstr(e.what(), "io_uring_queue_init") != nullptr && e.err() == EPERM;
  }
  // Auto: the thread pool, one warning, and it works.
  auto e = make_io_engine(testing::test_config(IoBackend::kAuto));
  auto src = testing::random_bytes(300001, 31);
  e->write(dir.file("f"), src.data(), static_cast<int64_t>(src.size()), 0).wait();
  std::vector<unsigned char> dst(src.size());
  e->read(dir.file("f"), dst.data(), static_cast<int64_t>(dst.size()), 0).wait();
  return probe_refused && explicit_failed && std::strcmp(e->backend_name(), "threads") == 0 &&
         dst == src && warnings_emitted().size() == 1;
}

[[noreturn]] void engines_without_io_uring() {
  if (!block_io_uring_setup()) std::exit(3);
  std::exit(fallback_works() ? 0 : 1);
}

TEST(offload_BackendFallbackDeathTest, AutoFallsBackToThreadsWhenIoUringIsBlocked) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(engines_without_io_uring(), ::testing::ExitedWithCode(0), "io_uring is unavailable");
}

}  // namespace
}  // namespace zs::offload
