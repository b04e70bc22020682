#include "offload/io_error.h"

#include <cstring>
#include <sstream>

namespace zs::offload {

std::string describe_io_failure(const char* op, const std::string& path, int64_t offset,
                                int64_t length, int err) {
  std::ostringstream os;
  os << op << " " << path << " at offset " << offset << ", length " << length << ": "
     << std::strerror(err) << " (errno " << err << ")";
  return os.str();
}

void throw_io_error(const char* op, const std::string& path, int64_t offset, int64_t length,
                    int neg_or_pos_errno) {
  const int err = neg_or_pos_errno < 0 ? -neg_or_pos_errno : neg_or_pos_errno;
  throw IoError(describe_io_failure(op, path, offset, length, err), err);
}

}  // namespace zs::offload
