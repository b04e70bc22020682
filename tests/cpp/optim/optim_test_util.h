// Helpers shared by the optim tests: deterministic buffers and the levels this CPU runs.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/cpu_features.h"
#include "optim/dtype.h"
#include "optim/half.h"

namespace zs::optim::testing {

inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// Grad bytes of `values` in `dtype` (16-bit ones rounded to nearest even).
inline std::vector<uint8_t> as_dtype(const std::vector<float>& values, DType dtype) {
  std::vector<uint8_t> out(values.size() * dtype_size(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kFloat32) {
      std::memcpy(out.data() + 4 * i, &values[i], 4);
    } else {
      const uint16_t h = dtype == DType::kBFloat16 ? f32_to_bf16(values[i]) : f32_to_f16(values[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

inline bool level_supported(SimdLevel level) {
  const CpuFeatures& f = cpu_features();
  switch (level) {
    case SimdLevel::kScalar: return true;
    case SimdLevel::kNeon: return f.neon;
    case SimdLevel::kAvx2: return f.avx2 && f.fma && f.f16c;
    case SimdLevel::kAvx512: return f.avx512f && f.avx512bw && f.avx512vl && f.fma && f.f16c;
  }
  return false;
}

}  // namespace zs::optim::testing
