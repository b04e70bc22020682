// io_uring registered (fixed) buffers and files: same bytes as the plain path, slots are
// reused after unregistering, and the thread backend declines without changing anything.
#include <cstring>

#include "offload/io_engine.h"
#include "offload/swap_store.h"
#include "offload_test_util.h"

namespace zs::offload {
namespace {

using testing::AlignedBytes;
using testing::ScratchDir;

IoConfig fixed_config(IoBackend backend) {
  IoConfig c = testing::test_config(backend, 64 << 10, 8, 2);
  c.register_buffers = true;
  c.register_files = true;
  return c;
}

TEST(offload_FixedResources, RegisteredBuffersAndFilesRoundTrip) {
  ZS_SKIP_WITHOUT_IO_URING(IoBackend::kIoUring);
  ScratchDir dir;
  auto e = make_io_engine(fixed_config(IoBackend::kIoUring));
  const size_t n = (3 << 20) + 4096 + 77;  // direct body, buffered tail, both fixed-buffer
  AlignedBytes src(n), dst(n);
  testing::fill_random(src.data(), n, 21);
  ASSERT_TRUE(e->register_buffer(src.data(), static_cast<int64_t>(n)));
  ASSERT_TRUE(e->register_buffer(dst.data(), static_cast<int64_t>(n)));
  IoFilePtr f = e->open(dir.file("fixed"), OpenMode::kReadWrite);
  ASSERT_TRUE(e->register_file(f));
  e->submit(IoOp::kWrite, f, src.data(), static_cast<int64_t>(n), 8192).wait();
  EXPECT_EQ(0, std::memcmp(testing::posix_read(dir.file("fixed"), 8192, n).data(), src.data(), n));
  e->submit(IoOp::kRead, f, dst.data(), static_cast<int64_t>(n), 8192).wait();
  EXPECT_EQ(0, std::memcmp(dst.data(), src.data(), n));
  // A piece only partly inside a registered buffer takes the plain path, still correct.
  e->unregister_buffer(dst.data());
  std::memset(dst.data(), 0, n);
  e->submit(IoOp::kRead, f, dst.data(), static_cast<int64_t>(n), 8192).wait();
  EXPECT_EQ(0, std::memcmp(dst.data(), src.data(), n));
  e->unregister_file(f);
  e->unregister_buffer(src.data());
  // Slots come back: 100 register/unregister cycles never run out of 64 slots.
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(e->register_buffer(src.data(), 4096)) << i;
    e->unregister_buffer(src.data());
  }
}

TEST(offload_FixedResources, SwapStoreWithRegisteredFiles) {
  ZS_SKIP_WITHOUT_IO_URING(IoBackend::kIoUring);
  ScratchDir dir;
  auto e = make_io_engine(fixed_config(IoBackend::kIoUring));
  SwapStoreConfig c;
  c.nvme_path = dir.path();
  c.files = 3;
  auto data = testing::random_bytes(500000, 22);
  {
    SwapStore store(c, *e);
    store.write(1, data.data(), static_cast<int64_t>(data.size())).wait();
    std::vector<unsigned char> back(data.size());
    store.read(1, back.data(), static_cast<int64_t>(back.size())).wait();
    EXPECT_EQ(back, data);
  }
  SwapStore again(c, *e);  // the first store gave its file slots back
  again.write(2, data.data(), static_cast<int64_t>(data.size())).wait();
}

TEST(offload_FixedResources, ThreadBackendDeclines) {
  AlignedBytes buf(4096);
  EXPECT_FALSE(
      make_io_engine(fixed_config(IoBackend::kThreads))->register_buffer(buf.data(), 4096));
}

TEST(offload_FixedResources, IoUringDeclinesWhenTheConfigLeavesThemOff) {
  ZS_SKIP_WITHOUT_IO_URING(IoBackend::kIoUring);
  AlignedBytes buf(4096);
  auto plain = make_io_engine(testing::test_config(IoBackend::kIoUring));
  EXPECT_FALSE(plain->register_buffer(buf.data(), 4096));
}

}  // namespace
}  // namespace zs::offload
