#include "config/ds_config.h"

#include "common/check.h"

namespace zs::config {

Resolution check_config(std::string_view text, const std::string& source, const RunContext& ctx) {
  Json input;
  try {
    input = read_json_text(text, source);
  } catch (const ValueError& e) {
    Resolution r;
    r.errors.push_back(e.what());
    return r;
  }
  return resolve(input, ctx);
}

Resolution load_config(std::string_view text, const std::string& source, const RunContext& ctx) {
  Resolution r = check_config(text, source, ctx);
  if (!r.ok()) {
    std::string msg = "invalid DeepSpeed config " + source + ":";
    for (const std::string& e : r.errors) msg += "\n  " + e;
    throw ValueError(msg);
  }
  return r;
}

}  // namespace zs::config
