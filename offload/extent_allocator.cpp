#include "offload/extent_allocator.h"

#include <cstdint>
#include <iterator>

#include "common/check.h"

namespace zs::offload {

ExtentAllocator::ExtentAllocator(int files, int64_t align)
    : files_(static_cast<size_t>(files)), align_(align) {
  ZS_CHECK_VALUE(files >= 1, "swap store: need at least one file; got ", files);
  ZS_CHECK_VALUE(align > 0, "swap store: alignment must be positive; got ", align);
}

int64_t ExtentAllocator::reserved_bytes(int64_t bytes) const {
  ZS_CHECK_VALUE(bytes > 0, "swap store: extent size must be positive; got ", bytes);
  ZS_CHECK_VALUE(bytes <= INT64_MAX - align_, "swap store: extent size ", bytes,
                 " bytes is beyond what a file can hold");
  return (bytes + align_ - 1) / align_ * align_;
}

ExtentAllocator::Plan ExtentAllocator::plan(int64_t bytes) const {
  const int64_t need = reserved_bytes(bytes);
  Plan best;
  int64_t best_len = 0;
  for (size_t f = 0; f < files_.size(); ++f) {
    for (const auto& [off, len] : files_[f].free) {
      if (len >= need && (best.extent.file < 0 || len < best_len)) {
        best.extent = Extent{static_cast<int>(f), off, need};
        best.new_file_end = files_[f].end;
        best_len = len;
      }
    }
  }
  if (best.extent.file >= 0) return best;
  size_t lowest = 0;
  for (size_t f = 1; f < files_.size(); ++f) {
    if (files_[f].end < files_[lowest].end) lowest = f;
  }
  const FileSpace& fs = files_[lowest];
  int64_t start = fs.end;
  if (!fs.free.empty()) {
    const auto& [off, len] = *fs.free.rbegin();
    if (off + len == fs.end) start = off;  // reuse the free tail, grow the rest
  }
  best.extent = Extent{static_cast<int>(lowest), start, need};
  best.new_file_end = start + need;
  return best;
}

void ExtentAllocator::commit(const Plan& p) {
  FileSpace& fs = files_.at(static_cast<size_t>(p.extent.file));
  const int64_t begin = p.extent.offset;
  const int64_t end = begin + p.extent.bytes;
  // Carve [begin, end) out of the free range that contains it (if any).
  auto it = fs.free.upper_bound(begin);
  if (it != fs.free.begin()) {
    auto prev = std::prev(it);
    const int64_t f_off = prev->first;
    const int64_t f_end = prev->first + prev->second;
    if (f_off <= begin && begin < f_end) {
      fs.free.erase(prev);
      if (f_off < begin) fs.free[f_off] = begin - f_off;
      if (end < f_end) fs.free[end] = f_end - end;
    }
  }
  if (p.new_file_end > fs.end) fs.end = p.new_file_end;
  used_ += p.extent.bytes;
}

void ExtentAllocator::release(const Extent& e) {
  FileSpace& fs = files_.at(static_cast<size_t>(e.file));
  int64_t off = e.offset;
  int64_t len = e.bytes;
  auto next = fs.free.lower_bound(off);
  if (next != fs.free.end() && off + len == next->first) {
    len += next->second;
    next = fs.free.erase(next);
  }
  if (next != fs.free.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      off = prev->first;
      len += prev->second;
      fs.free.erase(prev);
    }
  }
  fs.free[off] = len;
  used_ -= e.bytes;
}

int64_t ExtentAllocator::free_bytes() const {
  int64_t total = 0;
  for (const auto& fs : files_) {
    for (const auto& [off, len] : fs.free) total += len;
  }
  return total;
}

int64_t ExtentAllocator::used_bytes() const { return used_; }

int64_t ExtentAllocator::free_ranges() const {
  int64_t n = 0;
  for (const auto& fs : files_) n += static_cast<int64_t>(fs.free.size());
  return n;
}

}  // namespace zs::offload
