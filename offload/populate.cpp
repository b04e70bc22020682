#include "offload/populate.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

namespace zs::offload {

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older headers lack it
#endif

namespace {

void touch_each_page(volatile char* p, size_t bytes, size_t page) {
  for (size_t at = 0; at < bytes; at += page) p[at] = p[at];
  if (bytes > 0) p[bytes - 1] = p[bytes - 1];
}

}  // namespace

void populate_pages(void* data, size_t bytes) {
  if (bytes == 0) return;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t first = begin & ~(page - 1);  // madvise wants a page-aligned start
  if (::madvise(reinterpret_cast<void*>(first), begin + bytes - first, MADV_POPULATE_WRITE) == 0)
    return;
  // EINVAL: a kernel without it; anything else (EFAULT, ENOMEM) is left for the read to
  // report the same way it would have without this hint.
  touch_each_page(static_cast<volatile char*>(data), bytes, page);
}

}  // namespace zs::offload
