// The CUDA seam of the host arena: registering page-locked ranges with cudaHostRegister so
// async H2D/D2H copies from arena buffers are true DMA (DeepSpeed's mlock-only buffers are
// not, see reference/offload_prior_art.md §1a). A no-op without ZS_WITH_CUDA or a GPU.
#pragma once

#include <cstddef>

namespace zs::offload {

// True when the range is now registered with CUDA. Never throws: failure means the
// buffer is still usable, only copies to a GPU take the slower staged path.
bool cuda_register_host(void* ptr, size_t bytes);
void cuda_unregister_host(void* ptr);

}  // namespace zs::offload
