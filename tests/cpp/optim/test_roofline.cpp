// The roofline probe moves exactly the documented bytes: p <- m <- v <- p rotated, the copy
// gets the grad's low 16-bit words (bf16 grads) at every level.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "optim/roofline.h"
#include "optim_test_util.h"

namespace zs::optim {
namespace {

template <class T>
T* aligned_array(size_t n) {
  return static_cast<T*>(std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64));
}

TEST(optim_roofline, RotatesStatesAndCopiesGradsAtEveryLevel) {
  constexpr size_t n = 100003;
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (!testing::level_supported(level)) continue;
    float* p = aligned_array<float>(n);
    float* m = aligned_array<float>(n);
    float* v = aligned_array<float>(n);
    uint16_t* g = aligned_array<uint16_t>(n);
    uint16_t* c = aligned_array<uint16_t>(n);
    for (size_t i = 0; i < n; ++i) {
      p[i] = 1.f * i;
      m[i] = 2.f * i;
      v[i] = 3.f * i;
      g[i] = static_cast<uint16_t>(i * 7);
    }
    roofline_pass({p, m, v, g, 2, c}, n, {2, static_cast<int>(level)});
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(p[i], 2.f * i) << simd_level_name(level) << " " << i;
      ASSERT_EQ(m[i], 3.f * i);
      ASSERT_EQ(v[i], 1.f * i);
      ASSERT_EQ(c[i], g[i]);
    }
    for (void* q : {static_cast<void*>(p), static_cast<void*>(m), static_cast<void*>(v),
                    static_cast<void*>(g), static_cast<void*>(c)}) {
      std::free(q);
    }
  }
}

}  // namespace
}  // namespace zs::optim
