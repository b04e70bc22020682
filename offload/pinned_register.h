// The CUDA seam of the host arena: registering page-locked ranges with cudaHostRegister so
// async H2D/D2H copies from arena buffers are true DMA (DeepSpeed's mlock-only buffers are
// not, see reference/offload_prior_art.md §1a). A no-op without ZS_WITH_CUDA or a GPU.
#pragma once

#include <cstddef>

namespace zs::offload {

enum class Registration { kRegistered, kNoDevice, kFailed };

// Whether the range is now registered with CUDA, or why not (no CUDA build or no GPU; or
// CUDA refused, with one warning). Never throws: the buffer is still usable, only copies to
// a GPU take the slower staged path.
Registration cuda_register_host(void* ptr, size_t bytes);
void cuda_unregister_host(void* ptr);

}  // namespace zs::offload
