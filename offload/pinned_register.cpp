#include "offload/pinned_register.h"

#ifdef ZS_WITH_CUDA
#include <cuda_runtime_api.h>

#include <mutex>
#include <string>
#include <unordered_map>

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

// Note [Unregistering on the registering device]
// cudaHostRegister ties the range to the context of the calling thread's current device.
// The last reference to a buffer may die on any thread (a finalizer, the copy stage's
// consumer, a thread of the user's that never chose a device): unregistering there would make
// the runtime create a context on device 0 (memory taken from another rank's GPU) and refuse
// the range, leaving it pinned. So each range remembers the device it was registered on, and
// the thread that unregisters it is bound to that device first (and stays so: restoring a
// thread that had no device would create the context this avoids).
namespace {
std::mutex g_devices_mu;
std::unordered_map<void*, int>& registered_devices() {
  static auto* devices = new std::unordered_map<void*, int>();  // never destroyed: see above
  return *devices;
}
}  // namespace

Registration cuda_register_host(void* ptr, size_t bytes) {
  if (!gpu_present() || bytes == 0) return Registration::kNoDevice;
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) device = -1;
  const cudaError_t err = cudaHostRegister(ptr, bytes, cudaHostRegisterDefault);
  if (err != cudaSuccess) {
    warn_once("cudaHostRegister", std::string("cudaHostRegister failed (") +
                                      cudaGetErrorString(err) +
                                      "): host arena buffers stay pageable for the GPU, so "
                                      "their copies are synchronous");
    return Registration::kFailed;
  }
  std::lock_guard<std::mutex> lock(g_devices_mu);
  registered_devices()[ptr] = device;
  return Registration::kRegistered;
}

void cuda_unregister_host(void* ptr) {
  int device = -1;
  {
    std::lock_guard<std::mutex> lock(g_devices_mu);
    auto it = registered_devices().find(ptr);
    if (it != registered_devices().end()) {
      device = it->second;
      registered_devices().erase(it);
    }
  }
  int current = -1;
  if (device >= 0 && (cudaGetDevice(&current) != cudaSuccess || current != device)) {
    cudaSetDevice(device);
  }
  cudaHostUnregister(ptr);
}

#else

Registration cuda_register_host(void*, size_t) { return Registration::kNoDevice; }
void cuda_unregister_host(void*) {}

#endif

}  // namespace zs::offload
