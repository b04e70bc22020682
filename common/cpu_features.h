// What the CPU this process runs on can do, for runtime SIMD dispatch and `zerostream report`.
#pragma once

#include <string>

namespace zs {

enum class SimdLevel { kScalar = 0, kNeon = 1, kAvx2 = 2, kAvx512 = 3 };

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512bf16 = false;
  bool neon = false;
};

// Probed once per process (cpuid on x86, compile-time on aarch64).
const CpuFeatures& cpu_features();

// The best level both the CPU and this build support. ZS_SIMD=scalar|avx2|avx512 in the
// environment caps it (tests force each level).
SimdLevel best_simd_level();

const char* simd_level_name(SimdLevel level);

// Parses "scalar", "neon", "avx2", "avx512"; throws zs::ValueError naming the choices.
SimdLevel parse_simd_level(const std::string& name);

}  // namespace zs
