#include "common/io_probe.h"

#include <fcntl.h>
#include <liburing.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace zs {
namespace {

std::string errno_text(const std::string& what, int err) {
  return what + ": " + std::strerror(err) + " (errno " + std::to_string(err) + ")";
}

}  // namespace

std::string probe_io_uring() {
  io_uring ring;
  int rc = io_uring_queue_init(4, &ring, 0);
  if (rc < 0) return errno_text("io_uring_queue_init", -rc);
  std::string result;
  io_uring_sqe* sqe = io_uring_get_sqe(&ring);
  io_uring_prep_nop(sqe);
  rc = io_uring_submit(&ring);
  if (rc < 0) {
    result = errno_text("io_uring_submit", -rc);
  } else {
    io_uring_cqe* cqe = nullptr;
    rc = io_uring_wait_cqe(&ring, &cqe);
    if (rc < 0) {
      result = errno_text("io_uring_wait_cqe", -rc);
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
  int fd = mkstemp(path.data());
  if (fd < 0) return errno_text("cannot create a file in " + dir, errno);
  close(fd);
  std::string result;
  fd = open(path.c_str(), O_RDWR | O_DIRECT);
  if (fd < 0) {
    result = errno_text("open with O_DIRECT in " + dir, errno);
  } else {
    void* buf = nullptr;
    if (posix_memalign(&buf, 4096, 4096) != 0) {
      result = "posix_memalign failed";
    } else {
      std::memset(buf, 0x5a, 4096);
      if (pwrite(fd, buf, 4096, 0) != 4096) {
        result = errno_text("O_DIRECT write in " + dir, errno);
      } else {
        std::memset(buf, 0, 4096);
        if (pread(fd, buf, 4096, 0) != 4096) {
          result = errno_text("O_DIRECT read in " + dir, errno);
        } else if (static_cast<unsigned char*>(buf)[4095] != 0x5a) {
          result = "O_DIRECT read returned different bytes in " + dir;
        }
      }
      free(buf);
    }
    close(fd);
  }
  unlink(path.c_str());
  return result;
}

}  // namespace zs
