// Shared helpers of the offload tests: a scratch directory, reproducible random bytes,
// and independent reference reads/writes through plain POSIX calls.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "offload/io_config.h"
#include "offload/io_probe.h"

namespace zs::offload::testing {

// A fresh directory under $ZS_TEST_TMP (default /tmp, ext4 here, so O_DIRECT works),
// removed with its contents when the object dies.
class ScratchDir {
 public:
  explicit ScratchDir(const char* base = nullptr) {
    const char* env = std::getenv("ZS_TEST_TMP");
    std::string tmpl = std::string(base ? base : (env ? env : "/tmp")) + "/zs_offload_XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) == nullptr) ADD_FAILURE() << "mkdtemp " << tmpl;
    path_ = buf.data();
  }
  ~ScratchDir() { std::system(("rm -rf '" + path_ + "'").c_str()); }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// xorshift64*: fast enough to fill 64 MiB in a test, different per seed.
inline void fill_random(void* dst, size_t n, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  auto* p = static_cast<unsigned char*>(dst);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    const uint64_t v = x * 0x2545F4914F6CDD1Dull;
    std::memcpy(p + i, &v, 8);
  }
  for (; i < n; ++i) p[i] = static_cast<unsigned char>(i * 131 + seed);
}

inline std::vector<unsigned char> random_bytes(size_t n, uint64_t seed) {
  std::vector<unsigned char> v(n);
  fill_random(v.data(), n, seed);
  return v;
}

// Reference I/O: buffered pread/pwrite loops, independent of the engines under test.
inline std::vector<unsigned char> posix_read(const std::string& path, int64_t offset, size_t n) {
  std::vector<unsigned char> out(n);
  const int fd = ::open(path.c_str(), O_RDONLY);
  EXPECT_GE(fd, 0) << path;
  size_t done = 0;
  while (fd >= 0 && done < n) {
    const ssize_t r = ::pread(fd, out.data() + done, n - done, offset + done);
    if (r <= 0) break;
    done += static_cast<size_t>(r);
  }
  if (fd >= 0) ::close(fd);
  EXPECT_EQ(done, n) << "reference read of " << path;
  return out;
}

inline void posix_write(const std::string& path, int64_t offset, const void* data, size_t n) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT, 0644);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(::pwrite(fd, data, n, offset), static_cast<ssize_t>(n));
  ::close(fd);
}

// A page-aligned heap buffer with an optional misalignment, for unaligned-pointer cases.
class AlignedBytes {
 public:
  AlignedBytes(size_t n, size_t misalign = 0) : n_(n) {
    if (::posix_memalign(&base_, 4096, n + misalign + 4096) != 0) base_ = nullptr;
    data_ = static_cast<unsigned char*>(base_) + misalign;
  }
  ~AlignedBytes() { std::free(base_); }
  AlignedBytes(const AlignedBytes&) = delete;
  AlignedBytes& operator=(const AlignedBytes&) = delete;
  unsigned char* data() { return data_; }
  size_t size() const { return n_; }

 private:
  void* base_ = nullptr;
  unsigned char* data_ = nullptr;
  size_t n_;
};

inline IoConfig test_config(IoBackend backend, int64_t block = 64 << 10, int depth = 8,
                            int threads = 2) {
  IoConfig c;
  c.backend = backend;
  c.block_size = block;
  c.queue_depth = depth;
  c.threads = threads;
  return c;
}

// Why this process cannot use io_uring (seccomp, kernel.io_uring_disabled, an old kernel),
// "" when it can: the probe behind "auto" and `zerostream report`, asked once.
inline const std::string& io_uring_unavailable_reason() {
  static const std::string why = probe_io_uring();
  return why;
}

inline std::string backend_param_name(const ::testing::TestParamInfo<IoBackend>& info) {
  return info.param == IoBackend::kIoUring ? "IoUring" : "Threads";
}

}  // namespace zs::offload::testing

// Skips the running test, with the probe's reason, when `backend` is io_uring and io_uring
// is unavailable here: such a test can neither pass nor say anything about the engine.
#define ZS_SKIP_WITHOUT_IO_URING(backend)                                    \
  do {                                                                       \
    if ((backend) == ::zs::offload::IoBackend::kIoUring &&                   \
        !::zs::offload::testing::io_uring_unavailable_reason().empty()) {    \
      GTEST_SKIP() << "io_uring is unavailable here: "                       \
                   << ::zs::offload::testing::io_uring_unavailable_reason(); \
    }                                                                        \
  } while (0)
