// Can this process use io_uring, and does a directory's filesystem accept O_DIRECT? Each
// probe returns "" when it works, else why not. The engine's "auto" backend, `zerostream
// report` and the io_uring tests' skips all ask probe_io_uring(), so they always agree.
#pragma once

#include <string>

namespace zs::offload {

// Sets up a small ring and round-trips one NOP through io_uring_enter, as an engine worker
// would. Catches seccomp filters, kernel.io_uring_disabled and kernels without io_uring.
std::string probe_io_uring();

// Writes and reads back one 4 KiB block with O_DIRECT in a temporary file under `dir`;
// the O_DIRECT open is IoFile's own (see open_direct in io_file.h).
std::string probe_o_direct(const std::string& dir);

}  // namespace zs::offload
