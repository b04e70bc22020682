#include "optim/dtype.h"

#include "common/check.h"

namespace zs::optim {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32: return "fp32";
    case DType::kBFloat16: return "bf16";
    case DType::kFloat16: return "fp16";
  }
  return "unknown";
}

DType parse_dtype(const std::string& name, const char* what) {
  if (name == "fp32" || name == "float32") return DType::kFloat32;
  if (name == "bf16" || name == "bfloat16") return DType::kBFloat16;
  if (name == "fp16" || name == "float16") return DType::kFloat16;
  throw ValueError(
      detail::concat(what, ": expected one of \"fp32\", \"bf16\", \"fp16\"; got \"", name, "\""));
}

}  // namespace zs::optim
