#include "offload/pinned_register.h"

#ifdef ZS_WITH_CUDA
#include <cuda_runtime_api.h>

#include <string>

#include "offload/log.h"
#endif

namespace zs::offload {

#ifdef ZS_WITH_CUDA

namespace {
bool gpu_present() {
  static const bool present = [] {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  }();
  return present;
}
}  // namespace

Registration cuda_register_host(void* ptr, size_t bytes) {
  if (!gpu_present() || bytes == 0) return Registration::kNoDevice;
  const cudaError_t err = cudaHostRegister(ptr, bytes, cudaHostRegisterDefault);
  if (err != cudaSuccess) {
    warn_once("cudaHostRegister", std::string("cudaHostRegister failed (") +
                                      cudaGetErrorString(err) +
                                      "): host arena buffers stay pageable for the GPU, so "
                                      "their copies are synchronous");
    return Registration::kFailed;
  }
  return Registration::kRegistered;
}

void cuda_unregister_host(void* ptr) { cudaHostUnregister(ptr); }

#else

Registration cuda_register_host(void*, size_t) { return Registration::kNoDevice; }
void cuda_unregister_host(void*) {}

#endif

}  // namespace zs::offload
