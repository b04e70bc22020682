// populate_pages: the pages become resident (mincore) and keep their bytes.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "offload/populate.h"

namespace zs::offload {
namespace {

size_t resident_pages(void* p, size_t bytes) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> vec((bytes + page - 1) / page);
  EXPECT_EQ(::mincore(p, bytes, vec.data()), 0);
  size_t n = 0;
  for (unsigned char v : vec) n += v & 1;
  return n;
}

TEST(offload_Populate, FaultsInEveryPageAndKeepsTheBytes) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t bytes = 256 * page;
  void* map = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(map, MAP_FAILED);
  auto* p = static_cast<char*>(map);
  std::memset(p + 7 * page, 0x5a, page);     // one page already touched, with bytes to keep
  ASSERT_LT(resident_pages(p, bytes), 16u);  // fresh anonymous memory is not resident

  // An unaligned start and length inside the mapping, as a tensor's chunk is.
  populate_pages(p + 100, bytes - 200);
  EXPECT_EQ(resident_pages(p, bytes), bytes / page);
  for (size_t i = 0; i < page; ++i) ASSERT_EQ(static_cast<unsigned char>(p[7 * page + i]), 0x5a);
  EXPECT_EQ(p[0], 0);
  EXPECT_EQ(p[bytes - 1], 0);
  populate_pages(p, 0);  // nothing to do
  ::munmap(map, bytes);
}

}  // namespace
}  // namespace zs::offload
