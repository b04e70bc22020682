// What the CUDA side of this build can do here: built or not, runtime and driver versions,
// visible GPUs, NCCL headers it was built against. Used by `zerostream report`.
#pragma once

#include <string>

namespace zs::cuda {

struct CudaStatus {
  bool built = false;       // compiled with ZS_WITH_CUDA
  int runtime_version = 0;  // cudaRuntimeGetVersion, e.g. 13000
  int driver_version = 0;   // 0 when no driver is installed
  int device_count = 0;
  bool kernel_ok = false;  // a probe kernel ran and wrote the expected value
  int nccl_version = 0;    // NCCL_VERSION_CODE of the headers built against, 0 if none
  std::string error;       // why device_count is 0 or the probe failed
};

// Probes the runtime; never throws (a machine without a driver is a normal case).
CudaStatus probe();

}  // namespace zs::cuda
