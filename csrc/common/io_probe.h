// Probes for `zerostream report`: can this process use io_uring, and does a directory's
// filesystem accept O_DIRECT? Each returns "" when it works, else why not.
#pragma once

#include <string>

namespace zs {

// Sets up a small ring and round-trips one NOP through it.
std::string probe_io_uring();

// Writes and reads back one 4 KiB block with O_DIRECT in a temporary file under `dir`.
std::string probe_o_direct(const std::string& dir);

}  // namespace zs
