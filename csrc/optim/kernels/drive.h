// Runs an update rule over [begin, end) of a StepBuffers for one vector-ops type V:
// alignment peel, full vectors (streaming or ordinary stores), tail. Included by each
// per-ISA translation unit, which instantiates it with its own V.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "optim/kernels/update_rules.h"
#include "optim/kernels/vec_scalar.h"

namespace zs::optim {
// Internal linkage: see Note [ISA isolation] in optim/kernels/kernel_table.h.
namespace {

inline bool is_aligned(const void* p, uintptr_t bytes) {
  return (reinterpret_cast<uintptr_t>(p) % bytes) == 0;
}

// Fewer than V::kWidth elements: copy them into zero-padded vectors, run the same rule on
// full vectors, copy the valid lanes back. Lanes are independent, so the results are
// exactly those the full-vector loop would give (padding lanes are discarded).
template <class V, class Rule, class L, DType G, Copy C>
void run_tail(const typename Rule::template K<V>& k, const StepBuffers& b, int64_t i, int64_t n) {
  constexpr int W = V::kWidth;
  // Big enough for W elements of any dtype; sizes not from dtype_size(): Note [ISA isolation].
  alignas(64) float p[W] = {}, s0[W] = {}, s1[W] = {};
  alignas(64) float g[W] = {};
  alignas(64) uint16_t cp[W] = {};
  constexpr size_t gsz = G == DType::kFloat32 ? 4 : 2;
  constexpr size_t psz = L::kParam == DType::kFloat32 ? 4 : 2;
  constexpr size_t ssz = L::kState == DType::kFloat32 ? 4 : 2;
  const auto at = [](const void* base, int64_t j, size_t size) {
    return static_cast<const char*>(base) + j * size;
  };
  std::memcpy(p, at(b.param, i, psz), n * psz);
  std::memcpy(g, at(b.grad, i, gsz), n * gsz);
  std::memcpy(s0, at(b.state0, i, ssz), n * ssz);
  if (Rule::kStates > 1) std::memcpy(s1, at(b.state1, i, ssz), n * ssz);
  StepBuffers t = b;
  t.param = p;
  t.grad = g;
  t.state0 = s0;
  t.state1 = s1;
  t.param_copy = cp;
  Rule::template apply<V, L, G, C, false>(k, t, 0);
  std::memcpy(const_cast<char*>(at(b.param, i, psz)), p, n * psz);
  std::memcpy(const_cast<char*>(at(b.state0, i, ssz)), s0, n * ssz);
  if (Rule::kStates > 1) std::memcpy(const_cast<char*>(at(b.state1, i, ssz)), s1, n * ssz);
  if (C != Copy::kNone) std::memcpy(static_cast<uint16_t*>(b.param_copy) + i, cp, n * 2);
}

// The hot loops work on local copies of the constants and the buffer pointers: stores
// through float* may alias anything reached through a reference, which made the compiler
// reload every pointer and flag after every store.
template <class V, class Rule, class L, DType G, Copy C, bool kNt>
void run_full(const typename Rule::template K<V>& k_in, const StepBuffers& b_in, int64_t begin,
              int64_t end) {
  const auto k = k_in;
  const StepBuffers b = b_in;
  for (int64_t i = begin; i < end; i += V::kWidth) Rule::template apply<V, L, G, C, kNt>(k, b, i);
}

// [begin, end) with ordinary stores: full vectors, then the tail.
template <class V, class Rule, class L, DType G, Copy C>
void run_plain(const typename Rule::template K<V>& k, const StepBuffers& b, int64_t begin,
               int64_t end) {
  const int64_t full_end = begin + (end - begin) / V::kWidth * V::kWidth;
  run_full<V, Rule, L, G, C, false>(k, b, begin, full_end);
  if (full_end < end) run_tail<V, Rule, L, G, C>(k, b, full_end, end - full_end);
}

// Streaming stores need every streamed buffer aligned to the vector width at the first full
// vector. The peel aligns the params; the states follow when their buffers share the
// params' offset (the usual flat-buffer layout). Otherwise: ordinary stores.
template <class V>
bool streams_aligned(const StepBuffers& b, int64_t i, int states) {
  constexpr uintptr_t kF32 = V::kWidth * 4;
  const auto f32 = [](const void* base) { return static_cast<const float*>(base); };
  return V::kWidth > 1 && is_aligned(f32(b.param) + i, kF32) &&
         is_aligned(f32(b.state0) + i, kF32) && (states < 2 || is_aligned(f32(b.state1) + i, kF32));
}

// Mode kOn: params and states stream, from the first 64-byte aligned param on.
template <class V, class Rule, class L, DType G, Copy C>
void run_stream_states(const typename Rule::template K<V>& k, const StepBuffers& b, int64_t begin,
                       int64_t end) {
  constexpr int W = V::kWidth;
  int64_t i = begin;
  const float* param = static_cast<const float*>(b.param);
  if (is_aligned(param + i, 4)) {
    const uintptr_t addr = reinterpret_cast<uintptr_t>(param + i);
    const int64_t head = std::min<int64_t>((W * 4 - addr % (W * 4)) % (W * 4) / 4, end - i);
    run_plain<V, Rule, L, G, C>(k, b, i, i + head);
    i += head;
  }
  if (!streams_aligned<V>(b, i, Rule::kStates)) return run_plain<V, Rule, L, G, C>(k, b, i, end);
  const int64_t full_end = i + (end - i) / W * W;
  run_full<V, Rule, L, G, C, true>(k, b, i, full_end);
  V::sfence();  // streaming stores are weakly ordered: publish before the caller joins
  run_plain<V, Rule, L, G, C>(k, b, full_end, end);
}

// Mode kCopy: only the 16-bit copy streams, two vectors (one 64-byte line) at a time, from
// its first 64-byte boundary on (Note [No streaming for the 16-bit copy]).
template <class V, class Rule, class L, DType G, Copy C>
void run_stream_copy(const typename Rule::template K<V>& k, const StepBuffers& b, int64_t begin,
                     int64_t end) {
  constexpr int W = V::kWidth;
  auto* copy = static_cast<uint16_t*>(b.param_copy);
  int64_t i = begin;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(copy + i);
  const int64_t head = std::min<int64_t>((64 - addr % 64) % 64 / 2, end - i);
  run_plain<V, Rule, L, G, C>(k, b, i, i + head);
  i += head;
  if constexpr (V::kStreamsCopyLines && C != Copy::kNone) {
    const auto kl = k;  // locals, as in run_full
    const StepBuffers bl = b;
    for (; i + 2 * W <= end; i += 2 * W) {
      const auto lo = Rule::template apply<V, L, G, Copy::kNone, false>(kl, bl, i);
      const auto hi = Rule::template apply<V, L, G, Copy::kNone, false>(kl, bl, i + W);
      V::template stream_copy_line<C == Copy::kF16>(copy + i, lo, hi);
    }
    V::sfence();
  }
  run_plain<V, Rule, L, G, C>(k, b, i, end);
}

template <class V, class Rule, class L, DType G, Copy C>
void run_gc(const typename Rule::template K<V>& k, const StepBuffers& b, int64_t begin, int64_t end,
            NonTemporal nt) {
  if (nt == NonTemporal::kOn && V::kWidth > 1) {
    run_stream_states<V, Rule, L, G, C>(k, b, begin, end);
  } else if (nt == NonTemporal::kCopy && V::kStreamsCopyLines && C != Copy::kNone) {
    run_stream_copy<V, Rule, L, G, C>(k, b, begin, end);
  } else {
    run_plain<V, Rule, L, G, C>(k, b, begin, end);
  }
}

template <class V, class Rule, class L, DType G>
void run_g(const typename Rule::template K<V>& k, const StepBuffers& b, int64_t begin, int64_t end,
           NonTemporal want_nt) {
  if constexpr (!L::kAllFp32) {
    // A 16-bit master is its own copy (checked by the front end); 16-bit buffers store
    // normally (Note [16-bit masters and states] in optim/step_types.h).
    return run_plain<V, Rule, L, G, Copy::kNone>(k, b, begin, end);
  } else {
    if (b.param_copy == nullptr) {
      return run_gc<V, Rule, L, G, Copy::kNone>(k, b, begin, end, want_nt);
    }
    if (b.copy_dtype == DType::kFloat16) {
      return run_gc<V, Rule, L, G, Copy::kF16>(k, b, begin, end, want_nt);
    }
    run_gc<V, Rule, L, G, Copy::kBf16>(k, b, begin, end, want_nt);
  }
}

template <class V, class Rule, class L>
void run_l(const typename Rule::template K<V>& k, const StepBuffers& b, int64_t begin, int64_t end,
           NonTemporal want_nt) {
  switch (b.grad_dtype) {
    case DType::kFloat32: return run_g<V, Rule, L, DType::kFloat32>(k, b, begin, end, want_nt);
    case DType::kBFloat16: return run_g<V, Rule, L, DType::kBFloat16>(k, b, begin, end, want_nt);
    case DType::kFloat16: return run_g<V, Rule, L, DType::kFloat16>(k, b, begin, end, want_nt);
  }
}

// The kernel entry points of kernel_table.h: one per rule, V chosen by the including TU.
template <class V, class Rule>
void run_rule(const typename Rule::Coeffs& c, const StepBuffers& b, int64_t begin, int64_t end,
              NonTemporal want_nt) {
  const auto k = Rule::template broadcast<V>(c);
  constexpr DType f32 = DType::kFloat32, bf16 = DType::kBFloat16, f16 = DType::kFloat16;
  const bool fp32_states = b.state_dtype == f32;
  switch (b.param_dtype) {
    case f32: return run_l<V, Rule, Layout<f32, f32>>(k, b, begin, end, want_nt);
    case bf16:
      if (fp32_states) return run_l<V, Rule, Layout<bf16, f32>>(k, b, begin, end, want_nt);
      return run_l<V, Rule, Layout<bf16, bf16>>(k, b, begin, end, want_nt);
    case f16:
      if (fp32_states) return run_l<V, Rule, Layout<f16, f32>>(k, b, begin, end, want_nt);
      return run_l<V, Rule, Layout<f16, f16>>(k, b, begin, end, want_nt);
  }
}

template <class V, DType G>
double sum_squares_g(const void* grad, float scale, int64_t begin, int64_t end) {
  auto acc = V::acc_zero();
  const auto s = V::set1(scale);
  int64_t i = begin;
  for (; i + V::kWidth <= end; i += V::kWidth) {
    acc = V::acc_add_squares(acc, V::mul(load_grad<V, G>(grad, i), s));
  }
  double total = V::acc_sum(acc);
  for (; i < end; ++i) {
    const double x = VecScalar::mul(load_grad<VecScalar, G>(grad, i), scale);
    total += x * x;
  }
  return total;
}

template <class V>
double sum_squares(const void* grad, DType dtype, float scale, int64_t begin, int64_t end) {
  switch (dtype) {
    case DType::kFloat32: return sum_squares_g<V, DType::kFloat32>(grad, scale, begin, end);
    case DType::kBFloat16: return sum_squares_g<V, DType::kBFloat16>(grad, scale, begin, end);
    case DType::kFloat16: return sum_squares_g<V, DType::kFloat16>(grad, scale, begin, end);
  }
  return 0.0;
}

}  // namespace
}  // namespace zs::optim
