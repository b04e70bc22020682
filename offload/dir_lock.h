// Ownership of a swap directory by one job (Note [Swap directory ownership]).
#pragma once

#include <string>

namespace zs::offload {

// Note [Swap directory ownership]
// Two jobs pointed at the same nvme_path would truncate and reuse each other's swap files
// and both train on garbage. A store therefore holds an exclusive flock on `<dir>/.lock`
// for its lifetime; the kernel drops it when the process dies, so a crashed job never
// blocks the next one. The lock file records "pid host" of the holder, which a second job
// reads to say who owns the directory. On release the file is unlinked while still
// locked; an acquirer that locked an inode which was unlinked meanwhile (stat of the path
// no longer matches fstat of its descriptor) starts over, so two owners cannot coexist.
class DirLock {
 public:
  DirLock() = default;
  // Locks `dir`/.lock or throws IoError (errno EBUSY) naming the directory and the holder.
  explicit DirLock(const std::string& dir);
  ~DirLock() { release(); }
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  DirLock(DirLock&& other) noexcept;
  DirLock& operator=(DirLock&& other) noexcept;

  void release();  // unlinks the lock file and drops the lock; idempotent
  bool held() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace zs::offload
