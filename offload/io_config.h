// Configuration of the offload I/O tier as plain structs. ds_config's `aio` section (with the
// zerostream extension key `aio.backend`) is mapped onto IoConfig in one place,
// io_config_for() in python/zerostream/offload/io.py; the native core never sees JSON.
// The member initializers are the engine's own defaults for direct users (DeepSpeed's
// aio_handle, benchmarks); a ds_config sets every field from its resolved section.
#pragma once

#include <cstdint>
#include <string>

namespace zs::offload {

// Which engine moves the bytes. `kAuto` tries io_uring and falls back to threads when ring
// setup fails (seccomp, old kernel, io_uring_disabled). Extension key `aio.backend`.
enum class IoBackend { kAuto, kIoUring, kThreads };

// Parses "auto" | "io_uring" | "threads"; throws zs::ValueError naming the choices.
IoBackend parse_io_backend(const std::string& name);
const char* io_backend_name(IoBackend backend);

// ds_config `aio` (DeepSpeed names in the comments) plus zerostream's own knobs.
struct IoConfig {
  int64_t block_size = 1 << 20;          // aio.block_size: bytes per submitted piece
  int queue_depth = 32;                  // aio.queue_depth: pieces in flight per worker
  int threads = 1;                       // aio.intra_op_parallelism: workers (one ring each)
  bool single_submit = false;            // aio.single_submit: one io_uring_submit per piece
  bool overlap_events = true;            // aio.overlap_events: refill as completions arrive
  IoBackend backend = IoBackend::kAuto;  // aio.backend (zerostream extension)
  bool use_direct = true;                // O_DIRECT where the filesystem accepts it
  bool register_buffers = false;         // io_uring fixed buffers for registered regions
  bool register_files = false;           // io_uring fixed files for engine-opened files

  // Throws zs::ValueError naming the key, the value and the allowed range.
  void validate() const;
};

}  // namespace zs::offload
