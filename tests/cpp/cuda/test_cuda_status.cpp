#include <gtest/gtest.h>

#include "cuda/cuda_status.h"

namespace zs::cuda {
namespace {

TEST(CudaStatus, MatchesHowThisTreeWasBuilt) {
  const CudaStatus s = probe();
#ifdef ZS_WITH_CUDA
  EXPECT_TRUE(s.built);
  EXPECT_GT(s.runtime_version, 0);
  if (s.device_count == 0) {
    EXPECT_FALSE(s.error.empty());  // a machine without a GPU says why
  } else {
    EXPECT_TRUE(s.kernel_ok) << s.error;
  }
#else
  EXPECT_FALSE(s.built);
  EXPECT_EQ(s.device_count, 0);
  EXPECT_NE(s.error.find("ZS_WITH_CUDA=OFF"), std::string::npos);
#endif
}

}  // namespace
}  // namespace zs::cuda
