#include "cuda_status.h"

#include <cuda_runtime.h>
#if __has_include(<nccl.h>)
#include <nccl.h>
#endif

namespace zs::cuda {
namespace {

__global__ void probe_kernel(int* out) { *out = 0x5a5a; }

// Runs one kernel on device 0 and checks what it wrote; returns "" or the error.
std::string run_probe_kernel() {
  int* d = nullptr;
  cudaError_t err = cudaMalloc(&d, sizeof(int));
  if (err != cudaSuccess) return cudaGetErrorString(err);
  probe_kernel<<<1, 1>>>(d);
  int host = 0;
  err = cudaMemcpy(&host, d, sizeof(int), cudaMemcpyDeviceToHost);
  cudaFree(d);
  if (err != cudaSuccess) return cudaGetErrorString(err);
  return host == 0x5a5a ? "" : "probe kernel wrote a wrong value";
}

}  // namespace

CudaStatus probe() {
  CudaStatus s;
  s.built = true;
#ifdef NCCL_VERSION_CODE
  s.nccl_version = NCCL_VERSION_CODE;
#endif
  cudaRuntimeGetVersion(&s.runtime_version);
  cudaDriverGetVersion(&s.driver_version);
  cudaError_t err = cudaGetDeviceCount(&s.device_count);
  if (err != cudaSuccess) {
    s.device_count = 0;
    s.error = cudaGetErrorString(err);
    return s;
  }
  if (s.device_count > 0) {
    s.error = run_probe_kernel();
    s.kernel_ok = s.error.empty();
  }
  return s;
}

}  // namespace zs::cuda
