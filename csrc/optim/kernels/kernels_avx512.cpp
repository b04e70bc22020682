// AVX-512 kernels. This file alone is compiled with -mavx512f/bw/vl -mfma -mf16c (see
// csrc/optim/CMakeLists.txt) and is only called when cpu_features() reports them.
#include "optim/kernels/x86_intrinsics.h"

#include "optim/kernels/drive.h"
#include "optim/kernels/kernel_table.h"
#include "optim/kernels/vec_avx512.h"

namespace zs::optim {
namespace {

using V = VecAvx512;

void adam(const AdamCoeffs& c, const StepBuffers& b, int64_t begin, int64_t end, NonTemporal nt) {
  run_rule<V, AdamRule>(c, b, begin, end, nt);
}
void adagrad(const AdagradCoeffs& c, const StepBuffers& b, int64_t begin, int64_t end,
             NonTemporal nt) {
  run_rule<V, AdagradRule>(c, b, begin, end, nt);
}
void lion(const LionCoeffs& c, const StepBuffers& b, int64_t begin, int64_t end, NonTemporal nt) {
  run_rule<V, LionRule>(c, b, begin, end, nt);
}

template <bool kNt>
void store_ps(float* p, __m512 x) {
  if constexpr (kNt)
    _mm512_stream_ps(p, x);
  else
    _mm512_store_ps(p, x);
}
template <bool kNt>
void store_si(uint16_t* p, __m512i x) {
  auto* q = reinterpret_cast<__m512i*>(p);
  if constexpr (kNt)
    _mm512_stream_si512(q, x);
  else
    _mm512_store_si512(q, x);
}

// See roofline.h. 32 elements per iteration so that every load and store, the 16-bit ones
// included, is a full 64-byte vector; stores stream as `nt` says. Buffers are 64-byte aligned at
// `begin` (checked by the front end).
template <bool kNt, bool kNtCopy>
void roofline_impl(const RooflineBuffers& r, int64_t begin, int64_t end) {
  const char* g = static_cast<const char*>(r.grad);
  auto* copy = static_cast<uint16_t*>(r.copy);
  int64_t i = begin;
  for (; i + 32 <= end; i += 32) {
    const __m512 p0 = _mm512_load_ps(r.p + i), p1 = _mm512_load_ps(r.p + i + 16);
    const __m512 m0 = _mm512_load_ps(r.m + i), m1 = _mm512_load_ps(r.m + i + 16);
    const __m512 v0 = _mm512_load_ps(r.v + i), v1 = _mm512_load_ps(r.v + i + 16);
    __m512i g0 = _mm512_loadu_si512(g + i * r.grad_bytes);
    if (r.grad_bytes == 4) {
      g0 = _mm512_xor_si512(g0, _mm512_loadu_si512(g + i * r.grad_bytes + 64));
    }
    store_ps<kNt>(r.p + i, m0);
    store_ps<kNt>(r.p + i + 16, m1);
    store_ps<kNt>(r.m + i, v0);
    store_ps<kNt>(r.m + i + 16, v1);
    store_ps<kNt>(r.v + i, p0);
    store_ps<kNt>(r.v + i + 16, p1);
    if (copy != nullptr) store_si<kNtCopy>(copy + i, g0);
  }
  if (kNt || kNtCopy) _mm_sfence();
  if (i < end) scalar_kernels().roofline(r, i, end, NonTemporal::kOff);
}

void roofline(const RooflineBuffers& r, int64_t begin, int64_t end, NonTemporal nt) {
  if (nt == NonTemporal::kOn) {
    roofline_impl<true, true>(r, begin, end);
  } else if (nt == NonTemporal::kCopy) {
    roofline_impl<false, true>(r, begin, end);
  } else {
    roofline_impl<false, false>(r, begin, end);
  }
}

}  // namespace

const KernelTable& avx512_kernels() {
  static const KernelTable table{SimdLevel::kAvx512, adam, adagrad, lion, sum_squares<V>, roofline};
  return table;
}

}  // namespace zs::optim
