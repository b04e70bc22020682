#include "offload/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "offload/io_error.h"

namespace zs::offload {
namespace {

std::string read_holder(int fd) {
  char buf[256] = {};
  const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  std::string who = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
  return who.empty() ? "an unknown process" : "pid " + who;
}

std::string this_holder() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "?");
  return std::to_string(::getpid()) + " on host " + host + "\n";
}

}  // namespace

DirLock::DirLock(const std::string& dir) : path_(dir + "/.lock") {
  for (;;) {
    const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) throw_io_error("open swap directory lock", path_, 0, 0, errno);
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      const std::string who = err == EWOULDBLOCK ? read_holder(fd) : std::string();
      ::close(fd);
      if (err == EWOULDBLOCK) {
        throw IoError("swap directory " + dir + " is in use by another job (" + who +
                          "); give each job its own nvme_path, or stop that job first",
                      EBUSY);
      }
      throw_io_error("lock swap directory", path_, 0, 0, err);
    }
    struct stat held {
    }, now{};
    if (::fstat(fd, &held) == 0 && ::stat(path_.c_str(), &now) == 0 && held.st_ino == now.st_ino &&
        held.st_dev == now.st_dev) {
      fd_ = fd;
      break;
    }
    ::close(fd);  // the previous owner unlinked this inode while we waited: try again
  }
  const std::string me = this_holder();
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) < 0) {
    const int err = errno;
    release();
    throw_io_error("write swap directory lock", path_, 0, 0, err);
  }
}

DirLock::DirLock(DirLock&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)) {}

DirLock& DirLock::operator=(DirLock&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

void DirLock::release() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // while still locked: see Note [Swap directory ownership]
  ::close(fd_);
  fd_ = -1;
}

}  // namespace zs::offload
