#include "cpu_features.h"

#include <cstdlib>

#include "check.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace zs {
namespace {

CpuFeatures probe() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = c & (1u << 27);
  f.fma = c & (1u << 12);
  f.f16c = c & (1u << 29);
  unsigned long long xcr0 = 0;
  if (osxsave) {
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = (static_cast<unsigned long long>(hi) << 32) | lo;
  }
  const bool ymm_os = (xcr0 & 0x6) == 0x6;    // SSE and AVX state saved by the OS
  const bool zmm_os = (xcr0 & 0xe6) == 0xe6;  // plus opmask and upper ZMM state
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.avx2 = ymm_os && (b & (1u << 5));
    f.avx512f = zmm_os && (b & (1u << 16));
    f.avx512bw = zmm_os && (b & (1u << 30));
    f.avx512vl = zmm_os && (b & (1u << 31));
  }
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) {
    f.avx512bf16 = zmm_os && (a & (1u << 5));
  }
  f.fma = f.fma && ymm_os;
  f.f16c = f.f16c && ymm_os;
#elif defined(__aarch64__)
  f.neon = true;
#endif
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = probe();
  return features;
}

SimdLevel parse_simd_level(const std::string& name) {
  if (name == "scalar") return SimdLevel::kScalar;
  if (name == "neon") return SimdLevel::kNeon;
  if (name == "avx2") return SimdLevel::kAvx2;
  if (name == "avx512") return SimdLevel::kAvx512;
  throw ValueError("ZS_SIMD: expected one of \"scalar\", \"neon\", \"avx2\", \"avx512\"; got \"" +
                   name + "\"");
}

SimdLevel best_simd_level() {
  const CpuFeatures& f = cpu_features();
  SimdLevel level = SimdLevel::kScalar;
  if (f.neon) level = SimdLevel::kNeon;
  if (f.avx2 && f.fma && f.f16c) level = SimdLevel::kAvx2;
  if (f.avx512f && f.avx512bw && f.avx512vl && f.fma && f.f16c) level = SimdLevel::kAvx512;
  if (const char* cap = std::getenv("ZS_SIMD"); cap != nullptr && *cap != '\0') {
    const SimdLevel wanted = parse_simd_level(cap);
    if (static_cast<int>(wanted) < static_cast<int>(level)) level = wanted;
  }
  return level;
}

const char* simd_level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar: return "scalar";
    case SimdLevel::kNeon: return "neon";
    case SimdLevel::kAvx2: return "avx2";
    case SimdLevel::kAvx512: return "avx512";
  }
  return "unknown";
}

}  // namespace zs
