// The swap store: where a rank's offloaded tensors live on NVMe. A few large files per rank
// instead of DeepSpeed's one file per tensor (reference/offload_prior_art.md §1b), an
// extent allocator mapping tensor ids to (file, offset, bytes), and optional CRC32C per
// extent checked on every read.
//
// Directory layout (one store per rank and purpose):
//
//   <nvme_path>/zerostream/rank<R>/<name>/swap_<K>.bin     K = 0 .. files-1
//
// `name` separates users of the same nvme_path ("optimizer", "params"). The files are
// scratch space: opening a store truncates them, destroying it deletes them. They grow in
// `grow_bytes` steps preallocated with fallocate, so running out of disk shows up at allocation
// time, before a byte is written, as an IoError (ENOSPC) that names the tensor, the bytes needed
// and the file; extents already written are untouched.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "offload/dir_lock.h"
#include "offload/extent_allocator.h"
#include "offload/io_engine.h"

namespace zs::offload {

struct SwapStoreConfig {
  std::string nvme_path;  // offload_*.nvme_path
  int rank = 0;
  std::string name = "swap";
  int files = 4;
  int64_t align = 0;  // extent alignment, a power of two in [4 KiB, 1 GiB]; 0: 4 KiB (O_DIRECT)
  int64_t grow_bytes = int64_t{64} << 20;  // preallocation step per file
  bool verify_checksums = false;           // zerostream.verify_swap_checksums (extension key)
};

struct SwapStoreStats {
  int64_t tensors = 0;
  int64_t used_bytes = 0;  // reserved by live extents
  int64_t file_bytes = 0;  // sum of the files' preallocated sizes
  int64_t free_bytes = 0;  // free ranges inside the files
  int64_t free_ranges = 0;
};

class SwapStore {
 public:
  // Creates the directory and files. The engine must outlive the store.
  SwapStore(const SwapStoreConfig& config, IoEngine& engine);
  ~SwapStore();  // close()
  // Waits for the store's requests still in flight, deletes its files and directory and
  // gives up the directory (its lock). Idempotent; nothing may be read or written after.
  void close();
  SwapStore(const SwapStore&) = delete;
  SwapStore& operator=(const SwapStore&) = delete;

  // Writes `bytes` for tensor `id`, (re)allocating its extent when new or resized. Throws
  // IoError(ENOSPC) before writing anything when the disk cannot hold it.
  IoTicket write(uint64_t id, const void* buf, int64_t bytes);
  // Reads tensor `id` back; `bytes` must be its stored size. With checksums the ticket
  // fails (EIO, naming file and offset) when the data read differs from what was written.
  IoTicket read(uint64_t id, void* buf, int64_t bytes);
  // Returns the extent to the free list once the tensor's own requests are finished.
  void free(uint64_t id);

  // Bytes the files grow by to hold tensors of `sizes` bytes (each rounded to the alignment):
  // what a preflight compares with the free space before anything is written.
  int64_t bytes_needed(const std::vector<int64_t>& sizes) const;
  // Free bytes on the filesystem of the store's directory (statvfs f_bavail * f_frsize).
  int64_t free_bytes_on_disk() const;

  bool contains(uint64_t id) const;
  int64_t size_of(uint64_t id) const;  // stored bytes; throws ValueError when unknown
  Extent extent_of(uint64_t id) const;
  SwapStoreStats stats() const;
  const std::string& directory() const { return dir_; }
  std::string file_path(int file) const;

 private:
  struct Entry;
  std::shared_ptr<Entry> find(uint64_t id, const char* what) const;
  Extent allocate(uint64_t id, int64_t bytes);
  void grow_file(int file, int64_t new_end, uint64_t id, int64_t bytes);

  SwapStoreConfig config_;
  IoEngine& engine_;
  std::string dir_;
  DirLock lock_;  // this job owns dir_ (Note [Swap directory ownership] in dir_lock.h)
  bool closed_ = false;
  std::vector<IoFilePtr> files_;
  mutable std::mutex mu_;
  ExtentAllocator alloc_;
  std::unordered_map<uint64_t, std::shared_ptr<Entry>> entries_;
};

}  // namespace zs::offload
