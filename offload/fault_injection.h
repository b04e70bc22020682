// Test-only fault injection for the I/O engines (TESTING.md: errors a real disk rarely
// gives on demand). Off unless the environment variable ZS_IO_FAULT is set or a test calls
// set_io_fault(). Attempts are counted process-wide across engines, 1-based, including
// resubmissions, so "the Nth attempt" is deterministic for a single-threaded test.
//
//   ZS_IO_FAULT=<nth>:<errno name or number>   attempt nth fails, e.g. 3:EIO or 2:28
//   ZS_IO_FAULT=<nth>:short                    attempt nth completes short (about half)
//   append ":every" to repeat every nth attempt instead of once
#pragma once

#include <cstdint>
#include <string>

namespace zs::offload {

struct FaultSpec {
  int64_t nth = 0;  // 0: off
  int err = 0;      // positive errno to fail with (when !short_transfer)
  bool short_transfer = false;
  bool every = false;  // repeat every nth attempt
};

// Throws zs::ValueError naming the variable and the accepted forms.
FaultSpec parse_fault_spec(const std::string& text);

// Installs `spec` and resets the attempt and injection counters.
void set_io_fault(const FaultSpec& spec);
void clear_io_fault();
int64_t io_faults_injected();

// What one attempt should do, decided by the engine right before it submits the attempt.
struct FaultAction {
  int err = 0;         // > 0: report this errno instead of the real result
  int64_t length = 0;  // bytes to actually submit (shorter than asked for "short")
};

// Counts the attempt and decides its fate. A "short" attempt really moves fewer bytes
// (a multiple of `align`, so the remainder stays valid for O_DIRECT): the engine must
// notice the short count and resubmit the rest, exactly as for a short kernel completion.
FaultAction next_io_fault(int64_t length, int64_t align);

}  // namespace zs::offload
