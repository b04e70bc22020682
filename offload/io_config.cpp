#include "offload/io_config.h"

#include "common/check.h"

namespace zs::offload {

IoBackend parse_io_backend(const std::string& name) {
  if (name == "auto") return IoBackend::kAuto;
  if (name == "io_uring") return IoBackend::kIoUring;
  if (name == "threads") return IoBackend::kThreads;
  throw ValueError(detail::concat("aio.backend: expected one of \"auto\", \"io_uring\", ",
                                  "\"threads\"; got \"", name, "\""));
}

const char* io_backend_name(IoBackend backend) {
  switch (backend) {
    case IoBackend::kAuto: return "auto";
    case IoBackend::kIoUring: return "io_uring";
    case IoBackend::kThreads: return "threads";
  }
  return "?";
}

void IoConfig::validate() const {
  // A power of two, so that pieces keep the alignment O_DIRECT needs: below 4 KiB the
  // direct pieces are 4 KiB (direct_piece_bytes, Note [Direct alignment]).
  ZS_CHECK_VALUE(
      block_size >= 512 && block_size <= (int64_t{1} << 30) && (block_size & (block_size - 1)) == 0,
      "aio.block_size: expected a power of two in [512, 1 GiB] (512 B to 1 GiB); got ", block_size);
  ZS_CHECK_VALUE(queue_depth >= 1 && queue_depth <= 4096, "aio.queue_depth: expected 1..4096; got ",
                 queue_depth);
  ZS_CHECK_VALUE(threads >= 1 && threads <= 256, "aio.intra_op_parallelism: expected 1..256; got ",
                 threads);
}

}  // namespace zs::offload
