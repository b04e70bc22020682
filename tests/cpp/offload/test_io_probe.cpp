// The probes behind "auto", `zerostream report` and the io_uring tests' skips: they answer
// without throwing, and a refusal names what failed and where.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "offload/io_probe.h"

namespace zs::offload {
namespace {

TEST(offload_IoProbe, ODirectWorksOnTheBuildTreeOrSaysWhy) {
  char dir[] = "/tmp/zs-probe-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string result = probe_o_direct(dir);
  // ext4/xfs accept O_DIRECT; when a filesystem refuses, the reason names the directory.
  if (!result.empty()) {
    EXPECT_NE(result.find(dir), std::string::npos) << result;
  }
  rmdir(dir);
}

TEST(offload_IoProbe, MissingDirectoryIsReportedWithItsPath) {
  const std::string result = probe_o_direct("/no/such/zs-dir");
  EXPECT_NE(result.find("cannot create a file in /no/such/zs-dir"), std::string::npos) << result;
  EXPECT_NE(result.find("No such file or directory"), std::string::npos) << result;
}

TEST(offload_IoProbe, IoUringAnswersWithoutThrowing) {
  const std::string result = probe_io_uring();
  if (!result.empty()) {
    EXPECT_NE(result.find("io_uring"), std::string::npos) << result;
  }
}

}  // namespace
}  // namespace zs::offload
