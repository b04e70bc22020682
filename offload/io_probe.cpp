#include "offload/io_probe.h"

#include <fcntl.h>
#include <liburing.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "offload/io_file.h"

namespace zs::offload {
namespace {

std::string errno_text(const std::string& what, int err) {
  return what + ": " + std::strerror(err) + " (errno " + std::to_string(err) + ")";
}

// One aligned block through the O_DIRECT descriptor of the existing file `path`.
std::string direct_round_trip(const std::string& path, const std::string& dir) {
  const int fd = open_direct(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return errno_text("open with O_DIRECT in " + dir, -fd);
  constexpr size_t kBytes = kDirectAlign;
  void* raw = nullptr;
  if (posix_memalign(&raw, kDirectAlign, kBytes) != 0) {
    ::close(fd);
    return "posix_memalign failed";
  }
  std::unique_ptr<unsigned char, decltype(&std::free)> buf(static_cast<unsigned char*>(raw),
                                                           &std::free);
  std::string result;
  std::memset(buf.get(), 0x5a, kBytes);
  ssize_t n = ::pwrite(fd, buf.get(), kBytes, 0);
  if (n != static_cast<ssize_t>(kBytes)) {
    result = n < 0 ? errno_text("O_DIRECT write in " + dir, errno)
                   : "O_DIRECT write in " + dir + " was short (" + std::to_string(n) + " bytes)";
  } else {
    std::memset(buf.get(), 0, kBytes);
    n = ::pread(fd, buf.get(), kBytes, 0);
    if (n != static_cast<ssize_t>(kBytes)) {
      result = n < 0 ? errno_text("O_DIRECT read in " + dir, errno)
                     : "O_DIRECT read in " + dir + " was short (" + std::to_string(n) + " bytes)";
    } else if (buf.get()[kBytes - 1] != 0x5a) {
      result = "O_DIRECT read returned different bytes in " + dir;
    }
  }
  ::close(fd);
  return result;
}

}  // namespace

std::string probe_io_uring() {
  io_uring ring;
  int rc = io_uring_queue_init(4, &ring, 0);
  if (rc < 0) return errno_text("io_uring_queue_init", -rc);
  std::string result;
  io_uring_prep_nop(io_uring_get_sqe(&ring));
  // One io_uring_enter submits and waits, as the engine's workers do (uring_engine.cpp).
  rc = io_uring_submit_and_wait(&ring, 1);
  if (rc < 0) {
    result = errno_text("io_uring_submit_and_wait", -rc);
  } else {
    io_uring_cqe* cqe = nullptr;
    rc = io_uring_peek_cqe(&ring, &cqe);
    if (rc < 0) {
      result = errno_text("io_uring_peek_cqe", -rc);
    } else {
      if (cqe->res < 0) result = errno_text("NOP completion", -cqe->res);
      io_uring_cqe_seen(&ring, cqe);
    }
  }
  io_uring_queue_exit(&ring);
  return result;
}

std::string probe_o_direct(const std::string& dir) {
  std::string path = dir + "/.zerostream-odirect-XXXXXX";
  const int fd = mkstemp(path.data());
  if (fd < 0) return errno_text("cannot create a file in " + dir, errno);
  ::close(fd);
  std::string result = direct_round_trip(path, dir);
  ::unlink(path.c_str());
  return result;
}

}  // namespace zs::offload
