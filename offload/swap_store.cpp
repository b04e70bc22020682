#include "offload/swap_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "common/check.h"
#include "offload/crc32c.h"
#include "offload/io_error.h"
#include "offload/log.h"

namespace zs::offload {

struct SwapStore::Entry {
  Extent extent;
  int64_t bytes = 0;
  uint32_t crc = 0;        // of the latest write, set when it lands (guarded by mu_)
  uint64_t write_seq = 0;  // numbers the writes, so a late callback of an older one is dropped
  IoRequestPtr last_write;
  std::vector<IoRequestPtr> inflight;  // this tensor's requests not yet waited for by free()

  void track(const IoRequestPtr& r) {
    std::vector<IoRequestPtr> live;
    for (auto& x : inflight) {
      if (!x->done()) live.push_back(std::move(x));
    }
    live.push_back(r);
    inflight.swap(live);
  }
};

namespace {

void make_dirs(const std::string& path) {
  // Another rank's store may remove an empty parent (close() below) between two mkdirs:
  // ENOENT then means "start again from the top", a few times.
  for (int attempt = 0;; ++attempt) {
    bool vanished = false;
    for (size_t pos = 1; pos <= path.size() && !vanished; ++pos) {
      if (pos != path.size() && path[pos] != '/') continue;
      const std::string prefix = path.substr(0, pos);
      if (::mkdir(prefix.c_str(), 0755) == 0 || errno == EEXIST) continue;
      if (errno != ENOENT || attempt == 8) {
        throw_io_error("create swap directory", prefix, 0, 0, errno);
      }
      vanished = true;
    }
    if (!vanished) return;
  }
}

int64_t free_space(const std::string& dir) {
  struct statvfs st {};
  if (::statvfs(dir.c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize);
}

// Wait for requests without raising: their callers see the errors through their tickets.
void drain(const std::vector<IoRequestPtr>& reqs) {
  for (const auto& r : reqs) {
    try {
      r->wait(/*observe=*/false);
    } catch (const std::exception&) {
    }
  }
}

}  // namespace

SwapStore::SwapStore(const SwapStoreConfig& config, IoEngine& engine)
    : config_(config),
      engine_(engine),
      alloc_(config.files, config.align > 0 ? config.align : kDirectAlign) {
  ZS_CHECK_VALUE(!config.nvme_path.empty(), "swap store: nvme_path is empty");
  ZS_CHECK_VALUE(
      config.align == 0 || (config.align >= kDirectAlign && config.align <= (int64_t{1} << 30) &&
                            (config.align & (config.align - 1)) == 0),
      "swap store: alignment must be a power of two in [4096, 1 GiB]; got ", config.align);
  ZS_CHECK_VALUE(config.rank >= 0, "swap store: rank must be >= 0; got ", config.rank);
  ZS_CHECK_VALUE(config.grow_bytes >= 0, "swap store: grow_bytes must be >= 0");
  dir_ = config.nvme_path + "/zerostream/rank" + std::to_string(config.rank) + "/" + config.name;
  make_dirs(dir_);
  lock_ = DirLock(dir_);
  struct stat st {};
  if (::stat(file_path(0).c_str(), &st) == 0) {
    warn_once("stale:" + dir_, "swap store: " + dir_ +
                                   " holds swap files of a job that has ended; they are "
                                   "removed and the space reused");
  }
  for (int f = 0; f < config.files; ++f) {
    IoFilePtr file = engine.open(file_path(f), OpenMode::kReadWrite);
    if (::ftruncate(file->buffered_fd(), 0) != 0) {
      throw_io_error("truncate swap file", file->path(), 0, 0, errno);
    }
    engine.register_file(file);  // a no-op unless IoConfig::register_files
    files_.push_back(std::move(file));
  }
}

SwapStore::~SwapStore() { close(); }

void SwapStore::close() {
  if (closed_) return;
  closed_ = true;
  std::vector<IoRequestPtr> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, e] : entries_) all.insert(all.end(), e->inflight.begin(), e->inflight.end());
  }
  drain(all);
  for (const auto& f : files_) engine_.unregister_file(f);
  // The files are scratch (see swap_store.h): when the store goes, so does its disk space.
  const int n = static_cast<int>(files_.size());
  files_.clear();
  for (int k = 0; k < n; ++k) ::unlink(file_path(k).c_str());
  lock_.release();
  // <nvme_path>/zerostream/rank<R>/<name>, then its parents, each only if empty (another
  // store or rank may still use them); nvme_path itself is the user's.
  std::string d = dir_;
  for (int level = 0; level < 3 && ::rmdir(d.c_str()) == 0; ++level) {
    d = d.substr(0, d.find_last_of('/'));
  }
}

std::string SwapStore::file_path(int file) const {
  char name[32];
  std::snprintf(name, sizeof(name), "/swap_%02d.bin", file);
  return dir_ + name;
}

void SwapStore::grow_file(int file, int64_t new_end, uint64_t id, int64_t bytes) {
  const IoFilePtr& f = files_[static_cast<size_t>(file)];
  const int64_t cur = f->size();
  if (new_end <= cur) return;
  const int fd = f->buffered_fd();
  // A failed fallocate may keep the blocks it took and move the file's end (ext4 does):
  // shrink back, so a failure leaves the disk as it was.
  auto preallocate = [&](int64_t end) {
    if (::fallocate(fd, 0, cur, end - cur) == 0) return 0;
    const int e = errno;
    if (::ftruncate(fd, cur) != 0) {
      warn_once("shrink:" + f->path(), "swap store: could not shrink " + f->path() + " back to " +
                                           std::to_string(cur) +
                                           " bytes after a failed preallocation");
    }
    return e;
  };
  // Preallocate a step ahead so the file grows rarely; near a full disk ask only for what
  // this tensor needs, and when even that is more than the free space, ask for nothing:
  // the error is the same and no blocks are taken and given back.
  const int64_t free = free_space(dir_);
  const int64_t step = std::max(new_end, cur + config_.grow_bytes);
  int err = 0;
  if (free >= 0 && new_end - cur > free) {
    err = ENOSPC;
  } else {
    err = (free >= 0 && step - cur > free) ? ENOSPC : preallocate(step);
    if (err != 0 && step > new_end && (err == ENOSPC || err == EDQUOT || err == EFBIG)) {
      err = preallocate(new_end);
    }
    if (err == EOPNOTSUPP) {
      warn_once("fallocate:" + dir_, "swap store: the filesystem of " + dir_ +
                                         " cannot preallocate (fallocate: EOPNOTSUPP); "
                                         "out-of-space will show up at write time");
      err = ::ftruncate(fd, new_end) == 0 ? 0 : errno;
    }
  }
  if (err == 0) return;
  std::ostringstream os;
  const bool no_space = err == ENOSPC || err == EDQUOT;
  os << (no_space ? "swap store out of space" : "swap store cannot grow its file") << ": tensor "
     << id << " needs " << bytes << " bytes (" << (new_end - cur) << " more bytes of " << f->path()
     << ", growing it from " << cur << " to " << new_end << " bytes)";
  if (no_space) {
    os << "; the filesystem at " << dir_ << " has " << free_space(dir_) << " bytes free";
  } else if (err == EFBIG) {
    os << "; the file would pass the largest file size the filesystem at " << dir_ << " allows";
  }
  os << ": " << std::strerror(err) << " (errno " << err << "). Tensors already stored are intact. "
     << (no_space ? "Free space or point nvme_path at a larger device."
                  : "Point nvme_path at another filesystem.");
  throw IoError(os.str(), err);
}

int64_t SwapStore::bytes_needed(const std::vector<int64_t>& sizes) const {
  int64_t total = 0;
  for (int64_t b : sizes) {
    const int64_t r = alloc_.reserved_bytes(b);
    ZS_CHECK_VALUE(total <= INT64_MAX - r, "swap store: the tensors' sizes overflow 64 bits");
    total += r;
  }
  return total;
}

int64_t SwapStore::free_bytes_on_disk() const { return free_space(dir_); }

Extent SwapStore::allocate(uint64_t id, int64_t bytes) {
  // Caller holds mu_: plan, grow, commit form one step so a failed grow changes nothing.
  const ExtentAllocator::Plan plan = alloc_.plan(bytes);
  grow_file(plan.extent.file, plan.new_file_end, id, bytes);
  alloc_.commit(plan);
  return plan.extent;
}

std::shared_ptr<SwapStore::Entry> SwapStore::find(uint64_t id, const char* what) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  ZS_CHECK_VALUE(it != entries_.end(), "swap store ", dir_, ": ", what, " of tensor ", id,
                 ", which is not stored");
  return it->second;
}

IoTicket SwapStore::write(uint64_t id, const void* buf, int64_t bytes) {
  ZS_CHECK_VALUE(!closed_, "swap store ", dir_, ": write of tensor ", id, " after close()");
  ZS_CHECK_VALUE(bytes > 0, "swap store: write of tensor ", id, " with ", bytes, " bytes");
  bool resize = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(id);
    resize = it != entries_.end() && it->second->bytes != bytes;
  }
  if (resize) free(id);
  std::lock_guard<std::mutex> lock(mu_);
  std::shared_ptr<Entry>& slot = entries_[id];
  if (!slot) {
    auto e = std::make_shared<Entry>();
    try {
      e->extent = allocate(id, bytes);
    } catch (...) {
      entries_.erase(id);
      throw;
    }
    e->bytes = bytes;
    slot = e;
  }
  std::function<void(IoRequest&)> checksum;
  if (config_.verify_checksums) {
    // The CRC is taken on the I/O thread once the write landed (the caller may not touch
    // the buffer before its ticket completes), so the step's thread never pays for it.
    const uint64_t seq = ++slot->write_seq;
    std::weak_ptr<Entry> weak = slot;
    checksum = [this, weak, seq](IoRequest& r) {
      const uint32_t crc = crc32c(r.buf, static_cast<size_t>(r.length));
      std::lock_guard<std::mutex> guard(mu_);
      if (auto e = weak.lock(); e && e->write_seq == seq) e->crc = crc;
    };
  }
  IoTicket t = engine_.submit(IoOp::kWrite, files_[static_cast<size_t>(slot->extent.file)],
                              const_cast<void*>(buf), bytes, slot->extent.offset,
                              std::move(checksum));
  slot->last_write = t.request();
  slot->track(t.request());
  return t;
}

IoTicket SwapStore::read(uint64_t id, void* buf, int64_t bytes) {
  ZS_CHECK_VALUE(!closed_, "swap store ", dir_, ": read of tensor ", id, " after close()");
  std::shared_ptr<Entry> e = find(id, "read");
  ZS_CHECK_VALUE(bytes == e->bytes, "swap store ", dir_, ": read of tensor ", id, " with ", bytes,
                 " bytes, but it was stored with ", e->bytes);
  IoRequestPtr last_write;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_write = e->last_write;
  }
  if (last_write) {
    // Reading before the write landed would return stale bytes: wait for it here.
    drain({last_write});
    if (last_write->failed()) {
      throw IoError("swap store " + dir_ + ": tensor " + std::to_string(id) +
                        " cannot be read: its last write failed",
                    EIO);
    }
  }
  std::function<void(IoRequest&)> verify;
  if (config_.verify_checksums) {
    uint32_t expected = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      expected = e->crc;
    }
    const Extent ext = e->extent;
    verify = [expected, ext, id](IoRequest& r) {
      const uint32_t got = crc32c(r.buf, static_cast<size_t>(r.length));
      if (got == expected) return;
      std::ostringstream os;
      os << "swap store checksum mismatch for tensor " << id << " in " << r.file->path()
         << " at offset " << ext.offset << ", length " << r.length << ": expected CRC32C 0x"
         << std::hex << expected << ", read 0x" << got << " (the file was modified or the "
         << "device returned corrupt data)";
      r.fail(os.str(), EIO);
    };
  }
  IoTicket t = engine_.submit(IoOp::kRead, files_[static_cast<size_t>(e->extent.file)], buf, bytes,
                              e->extent.offset, std::move(verify));
  std::lock_guard<std::mutex> lock(mu_);
  e->track(t.request());
  return t;
}

void SwapStore::free(uint64_t id) {
  std::shared_ptr<Entry> e;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end()) return;
    e = it->second;
    entries_.erase(it);
  }
  // The extent may be handed out again at once: its own I/O must be over first.
  drain(e->inflight);
  std::lock_guard<std::mutex> lock(mu_);
  alloc_.release(e->extent);
}

bool SwapStore::contains(uint64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.count(id) != 0;
}

int64_t SwapStore::size_of(uint64_t id) const { return find(id, "size")->bytes; }

Extent SwapStore::extent_of(uint64_t id) const { return find(id, "extent")->extent; }

SwapStoreStats SwapStore::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  SwapStoreStats s;
  s.tensors = static_cast<int64_t>(entries_.size());
  s.used_bytes = alloc_.used_bytes();
  s.free_bytes = alloc_.free_bytes();
  s.free_ranges = alloc_.free_ranges();
  for (const auto& f : files_) s.file_bytes += f->size();
  return s;
}

}  // namespace zs::offload
