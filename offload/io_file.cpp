#include "offload/io_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cerrno>

#include "offload/io_error.h"
#include "offload/log.h"

namespace zs::offload {
namespace {

int open_flags(OpenMode mode) {
  switch (mode) {
    case OpenMode::kRead: return O_RDONLY | O_CLOEXEC;
    case OpenMode::kWrite: return O_WRONLY | O_CREAT | O_CLOEXEC;
    case OpenMode::kReadWrite: return O_RDWR | O_CREAT | O_CLOEXEC;
  }
  return O_RDONLY | O_CLOEXEC;
}

const char* mode_name(OpenMode mode) {
  return mode == OpenMode::kRead ? "open for reading" : "open for writing";
}

}  // namespace

int open_direct(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), (flags & ~O_CREAT) | O_DIRECT);
  return fd >= 0 ? fd : -errno;
}

std::shared_ptr<IoFile> IoFile::open(const std::string& path, OpenMode mode, bool want_direct) {
  const int flags = open_flags(mode);
  const int buffered = ::open(path.c_str(), flags, 0644);
  if (buffered < 0) throw_io_error(mode_name(mode), path, 0, 0, errno);
  int direct = -1;
  if (want_direct) {
    direct = open_direct(path, flags);
    if (direct < 0) {
      const int err = -direct;
      direct = -1;
      if (err != EINVAL) {
        ::close(buffered);
        throw_io_error(mode_name(mode), path, 0, 0, err);
      }
      // tmpfs, some FUSE and ZFS versions: correct but through the page cache.
      warn_once("odirect:" + path.substr(0, path.rfind('/')),
                "the filesystem holding " + path +
                    " refuses O_DIRECT (EINVAL; tmpfs or similar): using buffered I/O "
                    "there. Bandwidth figures include the page cache and host memory use "
                    "grows with the files.");
    }
  }
  return std::shared_ptr<IoFile>(new IoFile(path, direct, buffered));
}

IoFile::~IoFile() {
  if (direct_fd_ >= 0) ::close(direct_fd_);
  if (buffered_fd_ >= 0) ::close(buffered_fd_);
}

int64_t IoFile::size() const {
  struct stat st {};
  if (::fstat(buffered_fd_, &st) != 0) throw_io_error("stat", path_, 0, 0, errno);
  return static_cast<int64_t>(st.st_size);
}

}  // namespace zs::offload
