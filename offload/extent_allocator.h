// Bookkeeping of the swap store's space: which byte ranges of which file are free. Pure
// arithmetic, no I/O: the store asks for a plan, makes the file as large as the plan says
// (fallocate), and only then commits, so a failed fallocate leaves nothing changed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

namespace zs::offload {

struct Extent {
  int file = -1;
  int64_t offset = 0;
  int64_t bytes = 0;  // reserved bytes: the request rounded up to the alignment
};

class ExtentAllocator {
 public:
  ExtentAllocator(int files, int64_t align);

  struct Plan {
    Extent extent;
    int64_t new_file_end = 0;  // > file_end(extent.file) when the file must grow
  };
  // Best fit among free ranges; otherwise extends the file whose end is lowest (using
  // its free tail if it has one), which spreads data over the files.
  Plan plan(int64_t bytes) const;
  // What an extent of `bytes` reserves: `bytes` rounded up to the alignment (the function
  // plan() uses, so a preflight that sums it predicts the files' growth exactly).
  int64_t reserved_bytes(int64_t bytes) const;
  void commit(const Plan& plan);
  // Returns the range to the free list, merged with free neighbours.
  void release(const Extent& extent);

  int64_t align() const { return align_; }
  int files() const { return static_cast<int>(files_.size()); }
  int64_t file_end(int file) const { return files_.at(static_cast<size_t>(file)).end; }
  int64_t free_bytes() const;  // free ranges inside the files
  int64_t used_bytes() const;  // sum of live extents
  int64_t free_ranges() const;

 private:
  struct FileSpace {
    int64_t end = 0;                  // bytes the file spans (allocated so far)
    std::map<int64_t, int64_t> free;  // offset -> length, non-adjacent
  };
  std::vector<FileSpace> files_;
  int64_t align_;
  int64_t used_ = 0;
};

}  // namespace zs::offload
