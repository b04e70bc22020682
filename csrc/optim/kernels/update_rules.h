// The per-element update rules of Adam/AdamW, Adagrad and Lion, written once over the
// vector-ops interface (see Note [One math, three ISAs]). Each rule's apply() updates
// V::kWidth consecutive elements starting at index i, one load and one store per stream,
// and returns the updated params.
//
// The operation order follows torch.optim's single-tensor implementations so results agree
// with them to fp32 rounding (tests/python/optim states the tolerances).
#pragma once

#include <cstdint>

#include "optim/kernels/kernel_table.h"

namespace zs::optim {
// Internal linkage: see Note [ISA isolation] in optim/kernels/kernel_table.h.
namespace {

enum class Copy { kNone, kBf16, kF16 };

// The element types of the master params (P) and the optimizer states (S) of a call:
// Note [16-bit masters and states] in optim/step_types.h.
template <DType P, DType S>
struct Layout {
  static constexpr DType kParam = P;
  static constexpr DType kState = S;
  static constexpr bool kAllFp32 = P == DType::kFloat32 && S == DType::kFloat32;
};
using Fp32Layout = Layout<DType::kFloat32, DType::kFloat32>;

template <class V, DType T>
inline typename V::F load_as(const void* base, int64_t i) {
  if constexpr (T == DType::kFloat32) {
    return V::load(static_cast<const float*>(base) + i);
  } else if constexpr (T == DType::kBFloat16) {
    return V::load_bf16(static_cast<const uint16_t*>(base) + i);
  } else {
    return V::load_f16(static_cast<const uint16_t*>(base) + i);
  }
}

// 16-bit results are rounded to nearest even here, once (Note [16-bit rounding]).
template <class V, DType T, bool kNt>
inline void store_as(void* base, int64_t i, typename V::F x) {
  if constexpr (T == DType::kFloat32) {
    V::template store<kNt>(static_cast<float*>(base) + i, x);
  } else if constexpr (T == DType::kBFloat16) {
    V::template store_bf16<kNt>(static_cast<uint16_t*>(base) + i, x);
  } else {
    V::template store_f16<kNt>(static_cast<uint16_t*>(base) + i, x);
  }
}

template <class V, DType G>
inline typename V::F load_grad(const void* g, int64_t i) {
  return load_as<V, G>(g, i);
}

// Note [No streaming for the 16-bit copy]
// A vector of 16-bit values fills half a cache line (AVX-512) or a quarter (AVX2). Streamed
// one vector at a time, such partial lines leave the write-combining buffers half-empty as
// the other streams compete for them: the kernel ran ~25% below the streaming probe. So
// store_copy always stores normally, and the rules return the updated params so that the
// driver can instead stream whole lines made of two AVX-512 vectors (mode kCopy). That is
// the one store worth streaming in an in-place step: p, m and v were read just before they
// are written, so their lines are already in cache, while every copy line would otherwise
// be read for ownership first (2 of ~30 bytes per param).
template <class V, Copy C>
inline void store_copy(void* copy, int64_t i, typename V::F p) {
  if constexpr (C == Copy::kBf16) {
    V::template store_bf16<false>(static_cast<uint16_t*>(copy) + i, p);
  } else if constexpr (C == Copy::kF16) {
    V::template store_f16<false>(static_cast<uint16_t*>(copy) + i, p);
  }
}

// torch.optim.Adam / AdamW (amsgrad=False, maximize=False):
//   g = g * scale; Adam: g += wd * p; AdamW: p *= 1 - lr * wd
//   m = lerp(m, g, 1 - beta1); v = beta2 * v + (1 - beta2) * g * g
//   p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps)
struct AdamRule {
  using Coeffs = AdamCoeffs;
  static constexpr int kStates = 2;
  template <class V>
  struct K {
    typename V::F scale, l2, decay, omb1, b2, omb2, ibc2, eps, nstep;
    bool use_l2, use_decay;
  };
  template <class V>
  static K<V> broadcast(const Coeffs& c) {
    return {V::set1(c.grad_scale),
            V::set1(c.l2),
            V::set1(c.decay),
            V::set1(c.one_minus_beta1),
            V::set1(c.beta2),
            V::set1(c.one_minus_beta2),
            V::set1(c.inv_bias_correction2_sqrt),
            V::set1(c.eps),
            V::set1(c.neg_step_size),
            c.use_l2,
            c.use_decay};
  }
  template <class V, class L, DType G, Copy C, bool kNt>
  static inline typename V::F apply(const K<V>& k, const StepBuffers& b, int64_t i) {
    using F = typename V::F;
    F p = load_as<V, L::kParam>(b.param, i);
    F g = V::mul(load_grad<V, G>(b.grad, i), k.scale);
    F m = load_as<V, L::kState>(b.state0, i);
    F v = load_as<V, L::kState>(b.state1, i);
    if (k.use_l2) g = V::mul_add(k.l2, p, g);
    if (k.use_decay) p = V::mul(p, k.decay);
    m = V::mul_add(k.omb1, V::sub(g, m), m);
    v = V::mul_add(V::mul(k.omb2, g), g, V::mul(v, k.b2));
    const F denom = V::mul_add(V::sqrt(v), k.ibc2, k.eps);
    p = V::mul_add(k.nstep, V::div(m, denom), p);
    store_as<V, L::kParam, kNt>(b.param, i, p);
    store_as<V, L::kState, kNt>(b.state0, i, m);
    store_as<V, L::kState, kNt>(b.state1, i, v);
    store_copy<V, C>(b.param_copy, i, p);
    return p;
  }
};

// torch.optim.Adagrad (lr_decay=0, initial_accumulator_value=0):
//   g = g * scale; g += wd * p; s += g * g; p -= lr * g / (sqrt(s) + eps)
struct AdagradRule {
  using Coeffs = AdagradCoeffs;
  static constexpr int kStates = 1;
  template <class V>
  struct K {
    typename V::F scale, l2, eps, neg_lr;
    bool use_l2;
  };
  template <class V>
  static K<V> broadcast(const Coeffs& c) {
    return {V::set1(c.grad_scale), V::set1(c.l2), V::set1(c.eps), V::set1(c.neg_lr), c.use_l2};
  }
  template <class V, class L, DType G, Copy C, bool kNt>
  static inline typename V::F apply(const K<V>& k, const StepBuffers& b, int64_t i) {
    using F = typename V::F;
    F p = load_as<V, L::kParam>(b.param, i);
    F g = V::mul(load_grad<V, G>(b.grad, i), k.scale);
    F s = load_as<V, L::kState>(b.state0, i);
    if (k.use_l2) g = V::mul_add(k.l2, p, g);
    s = V::mul_add(g, g, s);
    const F denom = V::add(V::sqrt(s), k.eps);
    p = V::mul_add(k.neg_lr, V::div(g, denom), p);
    store_as<V, L::kParam, kNt>(b.param, i, p);
    store_as<V, L::kState, kNt>(b.state0, i, s);
    store_copy<V, C>(b.param_copy, i, p);
    return p;
  }
};

// Lion (Chen et al. 2023), as DeepSpeed's CPU Lion and lucidrains' lion-pytorch:
//   g = g * scale; p *= 1 - lr * wd
//   p -= lr * sign(beta1 * m + (1 - beta1) * g); m = beta2 * m + (1 - beta2) * g
// Written, like torch ops, as separately rounded products and sums, so that a plain-torch
// reference reproduces the sign of values near zero bit for bit.
struct LionRule {
  using Coeffs = LionCoeffs;
  static constexpr int kStates = 1;
  template <class V>
  struct K {
    typename V::F scale, decay, b1, omb1, b2, omb2, neg_lr;
    bool use_decay;
  };
  template <class V>
  static K<V> broadcast(const Coeffs& c) {
    return {V::set1(c.grad_scale),      V::set1(c.decay), V::set1(c.beta1),
            V::set1(c.one_minus_beta1), V::set1(c.beta2), V::set1(c.one_minus_beta2),
            V::set1(c.neg_lr),          c.use_decay};
  }
  template <class V, class L, DType G, Copy C, bool kNt>
  static inline typename V::F apply(const K<V>& k, const StepBuffers& b, int64_t i) {
    using F = typename V::F;
    F p = load_as<V, L::kParam>(b.param, i);
    F g = V::mul(load_grad<V, G>(b.grad, i), k.scale);
    F m = load_as<V, L::kState>(b.state0, i);
    if (k.use_decay) p = V::mul(p, k.decay);
    const F c = V::add(V::mul(m, k.b1), V::mul(g, k.omb1));
    p = V::add(p, V::mul(k.neg_lr, V::sign(c)));
    m = V::add(V::mul(m, k.b2), V::mul(g, k.omb2));
    store_as<V, L::kParam, kNt>(b.param, i, p);
    store_as<V, L::kState, kNt>(b.state0, i, m);
    store_copy<V, C>(b.param_copy, i, p);
    return p;
  }
};

}  // namespace
}  // namespace zs::optim
