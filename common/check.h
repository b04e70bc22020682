// Check macros for the native core: throw with file:line and a built message.
// Model: NVTE_CHECK in TransformerEngine's common/util/logging.h.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace zs {

// Thrown for bad user input (config values, paths, sizes). Bound to Python ValueError.
class ValueError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Thrown for valid but unsupported settings. Bound to Python NotImplementedError.
class NotImplementedError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

inline void append(std::ostringstream&) {}

template <typename T, typename... Rest>
void append(std::ostringstream& os, const T& first, const Rest&... rest) {
  os << first;
  append(os, rest...);
}

template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  append(os, args...);
  return os.str();
}

}  // namespace detail
}  // namespace zs

// Broken internal invariant: std::runtime_error with the location.
#define ZS_CHECK(cond, ...)                                                                        \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      throw std::runtime_error(::zs::detail::concat(__FILE__, ":", __LINE__, ": ",                 \
                                                    "check failed (" #cond "): ", ##__VA_ARGS__)); \
    }                                                                                              \
  } while (0)

// Bad user input: zs::ValueError with the message only (it names the key or path).
#define ZS_CHECK_VALUE(cond, ...)                                           \
  do {                                                                      \
    if (!(cond)) throw ::zs::ValueError(::zs::detail::concat(__VA_ARGS__)); \
  } while (0)
