// Injected faults (ZS_IO_FAULT / set_io_fault): every error surfaces from wait() with the
// path, offset and strerror; short completions are finished by resubmitting the rest.
#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/check.h"
#include "offload/fault_injection.h"
#include "offload/io_engine.h"
#include "offload/io_error.h"
#include "offload_test_util.h"

namespace zs::offload {
namespace {

using testing::AlignedBytes;
using testing::ScratchDir;

class offload_Fault : public ::testing::TestWithParam<IoBackend> {
 protected:
  void SetUp() override { ZS_SKIP_WITHOUT_IO_URING(GetParam()); }
  void TearDown() override { clear_io_fault(); }
  // One worker and depth one keep the attempt order deterministic.
  std::unique_ptr<IoEngine> engine() {
    return make_io_engine(testing::test_config(GetParam(), 64 << 10, 1, 1));
  }
  ScratchDir dir_;
};

TEST_P(offload_Fault, InjectedErrnoOnAnyAttemptFailsTheRequestWithPathAndOffset) {
  auto e = engine();
  const int64_t n = 8 * (64 << 10);  // 8 pieces
  AlignedBytes src(n);
  testing::fill_random(src.data(), n, 3);
  for (int err : {EIO, ENOSPC, EINVAL}) {
    for (int nth : {1, 4, 8}) {
      SCOPED_TRACE(::testing::Message() << "errno=" << err << " nth=" << nth);
      FaultSpec spec;
      spec.nth = nth;
      spec.err = err;
      set_io_fault(spec);
      const std::string path = dir_.file("f" + std::to_string(err) + "_" + std::to_string(nth));
      IoTicket t = e->write(path, src.data(), n, 0);
      try {
        t.wait();
        FAIL() << "expected IoError";
      } catch (const IoError& ex) {
        const std::string what = ex.what();
        EXPECT_EQ(ex.err(), err);
        EXPECT_NE(what.find(path), std::string::npos) << what;
        EXPECT_NE(what.find(std::strerror(err)), std::string::npos) << what;
        const int64_t off = (nth - 1) * (64 << 10);
        EXPECT_NE(what.find("offset " + std::to_string(off)), std::string::npos) << what;
      }
      EXPECT_EQ(io_faults_injected(), 1);
      EXPECT_TRUE(t.done());
      // The engine is still healthy afterwards: the same write succeeds.
      clear_io_fault();
      e->write(path, src.data(), n, 0).wait();
      EXPECT_EQ(0, std::memcmp(testing::posix_read(path, 0, n).data(), src.data(), n));
      EXPECT_NO_THROW(e->wait_all());  // already raised by the ticket: not raised twice
    }
  }
}

TEST_P(offload_Fault, ReadErrorsSurfaceToo) {
  auto e = engine();
  auto src = testing::random_bytes(200000, 4);
  testing::posix_write(dir_.file("r"), 0, src.data(), src.size());
  set_io_fault(parse_fault_spec("2:EIO"));
  std::vector<unsigned char> dst(src.size());
  IoTicket t = e->read(dir_.file("r"), dst.data(), dst.size(), 0);
  EXPECT_THROW(t.wait(), IoError);
  EXPECT_EQ(io_faults_injected(), 1);
}

TEST_P(offload_Fault, WaitAllRaisesAFailureNobodyWaitedFor) {
  auto e = engine();
  auto src = testing::random_bytes(100000, 5);
  set_io_fault(parse_fault_spec("1:EIO"));
  e->write(dir_.file("w"), src.data(), src.size(), 0);
  EXPECT_THROW(e->wait_all(), IoError);
}

TEST_P(offload_Fault, ShortCompletionsAreCompletedWithTheRightBytes) {
  auto e = engine();
  for (const char* spec : {"1:short", "3:short", "2:short:every"}) {
    SCOPED_TRACE(spec);
    set_io_fault(parse_fault_spec(spec));
    const int64_t n = 5 * (64 << 10) + 1234;  // aligned body and a buffered tail
    AlignedBytes src(n);
    testing::fill_random(src.data(), n, 6);
    const std::string path = dir_.file(std::string("s") + spec[0] + spec[2]);
    e->write(path, src.data(), n, 0).wait();
    EXPECT_EQ(0, std::memcmp(testing::posix_read(path, 0, n).data(), src.data(), n));
    AlignedBytes dst(n);
    e->read(path, dst.data(), n, 0).wait();
    EXPECT_EQ(0, std::memcmp(dst.data(), src.data(), n));
    EXPECT_GE(io_faults_injected(), 1);
  }
}

TEST_P(offload_Fault, EagainIsRetriedTransparently) {
  auto e = engine();
  set_io_fault(parse_fault_spec("2:EAGAIN"));
  auto src = testing::random_bytes(300000, 8);
  e->write(dir_.file("again"), src.data(), src.size(), 0).wait();
  EXPECT_EQ(testing::posix_read(dir_.file("again"), 0, src.size()), src);
  EXPECT_EQ(io_faults_injected(), 1);
}

INSTANTIATE_TEST_SUITE_P(Backends, offload_Fault,
                         ::testing::Values(IoBackend::kIoUring, IoBackend::kThreads),
                         testing::backend_param_name);

TEST(offload_FaultSpec, AcceptsTheDocumentedFormsAndRejectsOthers) {
  EXPECT_EQ(parse_fault_spec("3:EIO").err, EIO);
  EXPECT_EQ(parse_fault_spec("3:EIO").nth, 3);
  EXPECT_EQ(parse_fault_spec("7:28").err, 28);
  EXPECT_TRUE(parse_fault_spec("2:short").short_transfer);
  EXPECT_TRUE(parse_fault_spec("2:short:every").every);
  for (const char* bad : {"", "EIO", "0:EIO", "x:EIO", "3:EWHAT", "3:short:often"}) {
    EXPECT_THROW(parse_fault_spec(bad), ValueError) << bad;
  }
}

}  // namespace
}  // namespace zs::offload
