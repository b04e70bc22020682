// Errors of the I/O tier. Every message names the path, the byte offset, the length and
// strerror(errno) (STYLE.md item 12), so a failed swap says which file and where.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace zs::offload {

// An operating-system level I/O failure. Bound to Python OSError (zerostream._C.IoError).
class IoError : public std::runtime_error {
 public:
  IoError(const std::string& what, int err) : std::runtime_error(what), err_(err) {}
  int err() const { return err_; }  // positive errno (0 when not from the OS)

 private:
  int err_;
};

// "<op> <path> at offset <o>, length <n>: <strerror(err)> (errno <err>)". `err` > 0.
std::string describe_io_failure(const char* op, const std::string& path, int64_t offset,
                                int64_t length, int err);

// Throws IoError built by describe_io_failure. `neg_or_pos_errno` may be -errno (liburing
// style) or errno; see STYLE.md item 6: callers pass the value, never read errno late.
[[noreturn]] void throw_io_error(const char* op, const std::string& path, int64_t offset,
                                 int64_t length, int neg_or_pos_errno);

}  // namespace zs::offload

// Decoder for liburing-style return values: throws IoError when `ret` < 0.
#define ZS_CHECK_URING(ret, op, path, offset, length)                                  \
  do {                                                                                 \
    const int zs_ret_ = (ret);                                                         \
    if (zs_ret_ < 0) ::zs::offload::throw_io_error(op, path, offset, length, zs_ret_); \
  } while (0)
