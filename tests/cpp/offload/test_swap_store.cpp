// The swap store against a reference map of id -> bytes: round trips, extent reuse,
// layout on disk, checksums catching corruption, and the extent allocator's invariants.
#include <sys/stat.h>

#include <cstring>
#include <map>
#include <random>

#include "common/check.h"
#include "offload/crc32c.h"
#include "offload/extent_allocator.h"
#include "offload/io_error.h"
#include "offload/swap_store.h"
#include "offload_test_util.h"

namespace zs::offload {
namespace {

using testing::AlignedBytes;
using testing::ScratchDir;

class offload_SwapStore : public ::testing::TestWithParam<IoBackend> {
 protected:
  void SetUp() override {
    ZS_SKIP_WITHOUT_IO_URING(GetParam());
    engine_ = make_io_engine(testing::test_config(GetParam(), 64 << 10, 8, 2));
  }
  SwapStoreConfig config(bool checksums = false) {
    SwapStoreConfig c;
    c.nvme_path = dir_.path();
    c.rank = 3;
    c.name = "optimizer";
    c.files = 2;
    c.align = 4096;
    c.grow_bytes = 1 << 20;
    c.verify_checksums = checksums;
    return c;
  }
  ScratchDir dir_;
  std::unique_ptr<IoEngine> engine_;
};

TEST_P(offload_SwapStore, DeletesItsScratchFilesWhenDestroyed) {
  std::string dir;
  {
    SwapStore store(config(), *engine_);
    dir = store.directory();
    const std::vector<unsigned char> bytes = testing::random_bytes(100000, 1);
    store.write(7, bytes.data(), static_cast<int64_t>(bytes.size())).wait();
    struct stat st {};
    ASSERT_EQ(::stat((dir + "/swap_00.bin").c_str(), &st), 0);
  }
  struct stat st {};
  EXPECT_NE(::stat((dir + "/swap_00.bin").c_str(), &st), 0);
  EXPECT_NE(::stat(dir.c_str(), &st), 0) << "the store's directory is left behind";
}

TEST_P(offload_SwapStore, RoundTripsManyTensorsAndReusesFreedExtents) {
  SwapStore store(config(), *engine_);
  EXPECT_EQ(store.directory(), dir_.path() + "/zerostream/rank3/optimizer");
  std::map<uint64_t, std::vector<unsigned char>> ref;
  std::mt19937_64 rng(42);
  for (uint64_t id = 0; id < 40; ++id) {
    const size_t n = 1 + rng() % (300 << 10);
    ref[id] = testing::random_bytes(n, id);
    store.write(id, ref[id].data(), static_cast<int64_t>(n)).wait();
  }
  const int64_t file_bytes_before = store.stats().file_bytes;
  for (uint64_t id = 0; id < 40; id += 2) {  // free every other one, then refill
    store.free(id);
    ref.erase(id);
  }
  for (uint64_t id = 100; id < 110; ++id) {
    ref[id] = testing::random_bytes(50000, id);
    store.write(id, ref[id].data(), 50000).wait();
  }
  EXPECT_EQ(store.stats().file_bytes, file_bytes_before);  // fit in the freed space
  for (auto& [id, bytes] : ref) {
    std::vector<unsigned char> got(bytes.size());
    store.read(id, got.data(), static_cast<int64_t>(got.size())).wait();
    ASSERT_EQ(got, bytes) << "tensor " << id;
    const Extent e = store.extent_of(id);
    EXPECT_EQ(e.offset % 4096, 0);
    // The bytes sit exactly where the store says they are.
    EXPECT_EQ(testing::posix_read(store.file_path(e.file), e.offset, bytes.size()), bytes);
  }
  EXPECT_EQ(store.stats().tensors, static_cast<int64_t>(ref.size()));
}

TEST_P(offload_SwapStore, RewritingWithANewSizeMovesTheTensor) {
  SwapStore store(config(), *engine_);
  auto a = testing::random_bytes(10000, 1);
  auto b = testing::random_bytes(90000, 2);
  store.write(7, a.data(), 10000).wait();
  store.write(7, b.data(), 90000).wait();
  std::vector<unsigned char> got(90000);
  store.read(7, got.data(), 90000).wait();
  EXPECT_EQ(got, b);
  EXPECT_THROW(store.read(7, got.data(), 10000), ValueError);
  EXPECT_THROW(store.read(8, got.data(), 10), ValueError);
}

TEST_P(offload_SwapStore, ChecksumsCatchBytesChangedOnDisk) {
  SwapStore store(config(true), *engine_);
  auto a = testing::random_bytes(123457, 3);
  store.write(1, a.data(), static_cast<int64_t>(a.size())).wait();
  std::vector<unsigned char> got(a.size());
  store.read(1, got.data(), static_cast<int64_t>(got.size())).wait();
  EXPECT_EQ(got, a);
  const Extent e = store.extent_of(1);
  const unsigned char flip = static_cast<unsigned char>(a[5000] ^ 0xFF);
  testing::posix_write(store.file_path(e.file), e.offset + 5000, &flip, 1);
  try {
    store.read(1, got.data(), static_cast<int64_t>(got.size())).wait();
    FAIL() << "corruption not detected";
  } catch (const IoError& err) {
    const std::string what = err.what();
    EXPECT_NE(what.find("checksum mismatch for tensor 1"), std::string::npos) << what;
    EXPECT_NE(what.find(store.file_path(e.file)), std::string::npos) << what;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, offload_SwapStore,
                         ::testing::Values(IoBackend::kIoUring, IoBackend::kThreads),
                         testing::backend_param_name);

// Random allocate/free against a byte-level occupancy reference: extents never overlap,
// stay aligned, and freed space is found again.
TEST(offload_ExtentAllocator, NeverOverlapsAndCoalescesFreedRanges) {
  ExtentAllocator alloc(3, 4096);
  std::vector<Extent> live;
  std::mt19937_64 rng(7);
  for (int step = 0; step < 3000; ++step) {
    if (!live.empty() && rng() % 3 == 0) {
      const size_t i = rng() % live.size();
      alloc.release(live[i]);
      live.erase(live.begin() + static_cast<long>(i));
    } else {
      auto plan = alloc.plan(1 + static_cast<int64_t>(rng() % 50000));
      alloc.commit(plan);
      live.push_back(plan.extent);
    }
  }
  std::map<std::pair<int, int64_t>, int64_t> sorted;
  int64_t used = 0;
  for (const auto& e : live) {
    EXPECT_EQ(e.offset % 4096, 0);
    EXPECT_LE(e.offset + e.bytes, alloc.file_end(e.file));
    sorted[{e.file, e.offset}] = e.bytes;
    used += e.bytes;
  }
  int prev_file = -1;
  int64_t prev_end = 0;
  for (const auto& [key, bytes] : sorted) {
    if (key.first == prev_file) {
      EXPECT_GE(key.second, prev_end) << "overlap";
    }
    prev_file = key.first;
    prev_end = key.second + bytes;
  }
  EXPECT_EQ(alloc.used_bytes(), used);
  int64_t total = 0;
  for (int f = 0; f < 3; ++f) total += alloc.file_end(f);
  EXPECT_EQ(alloc.free_bytes() + used, total);
  for (const auto& e : live) alloc.release(e);
  EXPECT_EQ(alloc.free_ranges(), 3);  // everything merged back: one range per file
}

TEST(offload_Crc32c, MatchesTheStandardCheckValueOnBothPaths) {
  const char* s = "123456789";
  EXPECT_EQ(crc32c(s, 9), 0xE3069283u);
  EXPECT_EQ(crc32c_portable(s, 9), 0xE3069283u);
  auto data = testing::random_bytes(100003, 9);
  EXPECT_EQ(crc32c(data.data(), data.size()), crc32c_portable(data.data(), data.size()));
  const uint32_t chained = crc32c(data.data() + 1000, data.size() - 1000,
                                  crc32c(data.data(), 1000));
  EXPECT_EQ(chained, crc32c(data.data(), data.size()));
}

TEST(offload_Crc32c, ThreeStreamsAgreeWithTheTableAtEveryBlockBoundary) {
  // Sizes around the short (3 x 256) and long (3 x 8192) blocks of Note [Three CRC streams],
  // from unaligned starts, chained from a nonzero CRC.
  auto data = testing::random_bytes(3 * 24576 + 64, 11);
  for (size_t start : {0, 1, 5}) {
    for (size_t n : {0, 1, 7, 8, 767, 768, 769, 1543, 24575, 24576, 24577, 49160, 73728}) {
      const unsigned char* p = data.data() + start;
      EXPECT_EQ(crc32c(p, n, 0x1234u), crc32c_portable(p, n, 0x1234u)) << start << " " << n;
    }
  }
}

}  // namespace
}  // namespace zs::offload
