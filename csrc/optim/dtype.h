// Element types the CPU optimizers read and write. The native core knows nothing of torch:
// the bindings map torch dtypes onto this enum.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace zs::optim {

enum class DType : int { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

inline size_t dtype_size(DType t) { return t == DType::kFloat32 ? 4 : 2; }

const char* dtype_name(DType t);

// Parses "fp32"/"float32", "bf16"/"bfloat16", "fp16"/"float16"; throws zs::ValueError that
// names `what` and the choices.
DType parse_dtype(const std::string& name, const char* what);

}  // namespace zs::optim
