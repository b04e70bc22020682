// Fixed (registered) buffers and files of the io_uring backend. Slots are numbered
// engine-wide and every ring's sparse table holds the same resource at the same index, so
// a piece can go to any worker. The table is read on every prep (shared lock) and changed
// only by register/unregister calls (exclusive lock).
#pragma once

#include <cstdint>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

#include "offload/io_file.h"

namespace zs::offload {

inline constexpr unsigned kFixedBufferSlots = 64;
inline constexpr unsigned kFixedFileSlots = 64;  // two per file: direct and buffered fd

class FixedTable {
 public:
  struct FileSlots {
    IoFilePtr file;  // keeps the descriptors open while registered
    int direct = -1;
    int buffered = -1;
  };

  // -1 when [p, p+len) is not inside one registered buffer.
  int buffer_slot(const char* p, int64_t len) const {
    std::shared_lock<std::shared_mutex> lock(mu_);
    for (const Buf& b : bufs_) {
      if (p >= b.base && p + len <= b.base + b.len) return b.slot;
    }
    return -1;
  }
  // -1 when the file (or that descriptor of it) is not registered.
  int file_slot(const IoFile* f, bool direct) const {
    std::shared_lock<std::shared_mutex> lock(mu_);
    auto it = files_.find(f);
    if (it == files_.end()) return -1;
    return direct ? it->second.direct : it->second.buffered;
  }

  // Slot bookkeeping, called with the table locked exclusively via lock().
  std::unique_lock<std::shared_mutex> lock() { return std::unique_lock<std::shared_mutex>(mu_); }
  int free_buffer_slot() const { return free_slot(buf_used_, kFixedBufferSlots); }
  int free_file_slot(int skip = -1) const {
    for (unsigned i = 0; i < kFixedFileSlots; ++i) {
      if (static_cast<int>(i) != skip && !(i < file_used_.size() && file_used_[i])) {
        return static_cast<int>(i);
      }
    }
    return -1;
  }
  void add_buffer(char* base, int64_t len, int slot) {
    mark(buf_used_, slot, true);
    bufs_.push_back(Buf{base, len, slot});
  }
  // Returns the slot removed, or -1.
  int remove_buffer(const char* base) {
    for (size_t i = 0; i < bufs_.size(); ++i) {
      if (bufs_[i].base != base) continue;
      const int slot = bufs_[i].slot;
      bufs_.erase(bufs_.begin() + static_cast<long>(i));
      mark(buf_used_, slot, false);
      return slot;
    }
    return -1;
  }
  void add_file(const FileSlots& slots) {
    if (slots.direct >= 0) mark(file_used_, slots.direct, true);
    if (slots.buffered >= 0) mark(file_used_, slots.buffered, true);
    files_[slots.file.get()] = slots;
  }
  FileSlots remove_file(const IoFile* f) {
    auto it = files_.find(f);
    if (it == files_.end()) return FileSlots{};
    FileSlots s = it->second;
    files_.erase(it);
    if (s.direct >= 0) mark(file_used_, s.direct, false);
    if (s.buffered >= 0) mark(file_used_, s.buffered, false);
    return s;
  }

 private:
  struct Buf {
    char* base;
    int64_t len;
    int slot;
  };
  static int free_slot(const std::vector<bool>& used, unsigned n) {
    for (unsigned i = 0; i < n; ++i) {
      if (!(i < used.size() && used[i])) return static_cast<int>(i);
    }
    return -1;
  }
  static void mark(std::vector<bool>& used, int slot, bool value) {
    if (used.size() <= static_cast<size_t>(slot)) used.resize(static_cast<size_t>(slot) + 1);
    used[static_cast<size_t>(slot)] = value;
  }

  mutable std::shared_mutex mu_;
  std::vector<Buf> bufs_;
  std::unordered_map<const IoFile*, FileSlots> files_;
  std::vector<bool> buf_used_;
  std::vector<bool> file_used_;
};

}  // namespace zs::offload
