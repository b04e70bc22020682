// ZS_WITH_CUDA=OFF: the build has no CUDA side; report says so.
#include "cuda_status.h"

namespace zs::cuda {

CudaStatus probe() {
  CudaStatus s;
  s.error = "zerostream was built without CUDA (ZS_WITH_CUDA=OFF)";
  return s;
}

}  // namespace zs::cuda
