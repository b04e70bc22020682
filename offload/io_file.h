// An open swap or user file: an O_DIRECT descriptor for aligned pieces and a buffered one
// for unaligned heads and tails. Shared by the requests that use it (shared_ptr), closed
// when the last one completes, so no descriptor outlives its I/O or leaks on error.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace zs::offload {

// Note [Direct alignment]
// O_DIRECT needs the buffer address, the file offset and the length to be multiples of
// the device's logical block size (512 B or 4 KiB). We align to 4 KiB, which covers both
// and is the page size, so host-arena buffers qualify. A request is split into an
// unaligned head, an aligned body and an unaligned tail: the body goes through the
// O_DIRECT descriptor, head and tail through the buffered one. No page is shared by a
// direct and a buffered piece of the same request, and Linux flushes/invalidates the page
// cache around direct I/O, so the two descriptors see the same bytes. Unaligned requests
// therefore stay correct (DeepSpeed instead lost the unaligned tail silently, #1070).
// A block_size below 4 KiB (DeepSpeed's own aio tests use 1 KiB) cuts the buffered pieces
// at block_size and the direct ones at 4 KiB: a smaller direct piece could not be aligned.
inline constexpr int64_t kDirectAlign = 4096;

// The length of the direct pieces a request is cut into (block_size is a power of two).
inline int64_t direct_piece_bytes(int64_t block_size) {
  return block_size > kDirectAlign ? block_size : kDirectAlign;
}

// Opens the existing file `path` with `flags` | O_DIRECT (O_CREAT dropped); returns the
// descriptor or -errno. -EINVAL is the filesystem refusing O_DIRECT (ramfs, tmpfs before
// Linux 6.6, some FUSE and ZFS versions): IoFile::open then falls back to buffered I/O,
// and probe_o_direct (io_probe.h) reports it.
int open_direct(const std::string& path, int flags);

enum class OpenMode { kRead, kWrite, kReadWrite };

class IoFile {
 public:
  // Opens `path`. Write modes create it (0644) and never truncate. With `want_direct`,
  // a filesystem that refuses O_DIRECT (tmpfs: EINVAL) gets one warning and buffered
  // I/O. Throws IoError naming the path and errno.
  static std::shared_ptr<IoFile> open(const std::string& path, OpenMode mode, bool want_direct);
  ~IoFile();
  IoFile(const IoFile&) = delete;
  IoFile& operator=(const IoFile&) = delete;

  const std::string& path() const { return path_; }
  bool direct() const { return direct_fd_ >= 0; }
  int direct_fd() const { return direct_fd_; }
  int buffered_fd() const { return buffered_fd_; }
  int64_t size() const;  // fstat; throws IoError

 private:
  IoFile(std::string path, int direct_fd, int buffered_fd)
      : path_(std::move(path)), direct_fd_(direct_fd), buffered_fd_(buffered_fd) {}
  std::string path_;
  int direct_fd_;
  int buffered_fd_;
};

using IoFilePtr = std::shared_ptr<IoFile>;

}  // namespace zs::offload
