// Bindings of the CPU optimizers (csrc/optim): zerostream._C.optim.
//
// Tensors cross as (data_ptr, numel, dtype name): the native core knows nothing of torch,
// and python/zerostream/ops/_cpu_optimizer.py turns tensors into these arguments after
// checking device, dtype, contiguity and sizes. Every kernel call releases the GIL.
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "bindings/bindings.h"
#include "common/check.h"
#include "common/cpu_features.h"
#include "optim/adagrad.h"
#include "optim/adam.h"
#include "optim/grad_stats.h"
#include "optim/lion.h"
#include "optim/roofline.h"

namespace py = pybind11;

namespace zs::bindings {
namespace {

using optim::DType;

template <class T>
T* ptr(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

optim::RunOptions run_options(int threads, const std::string& simd, const std::string& nt) {
  optim::RunOptions run;
  run.threads = threads;
  run.simd = simd.empty() ? -1 : static_cast<int>(parse_simd_level(simd));
  if (nt == "auto") {
    run.nontemporal = optim::NonTemporal::kAuto;
  } else if (nt == "on") {
    run.nontemporal = optim::NonTemporal::kOn;
  } else if (nt == "off") {
    run.nontemporal = optim::NonTemporal::kOff;
  } else if (nt == "copy") {
    run.nontemporal = optim::NonTemporal::kCopy;
  } else {
    throw ValueError("nontemporal: expected one of \"auto\", \"on\", \"off\", \"copy\"; got \"" +
                     nt + "\"");
  }
  return run;
}

// param_dtype and state_dtype: Note [16-bit masters and states] in optim/step_types.h.
optim::StepBuffers buffers(uintptr_t param, uintptr_t grad, const std::string& grad_dtype,
                           uintptr_t state0, uintptr_t state1, uintptr_t copy,
                           const std::string& copy_dtype, int64_t numel,
                           const std::string& param_dtype, const std::string& state_dtype) {
  optim::StepBuffers b;
  b.param = ptr<void>(param);
  b.param_dtype = optim::parse_dtype(param_dtype, "param_dtype");
  b.state_dtype = optim::parse_dtype(state_dtype, "state_dtype");
  b.grad = ptr<const void>(grad);
  b.grad_dtype = optim::parse_dtype(grad_dtype, "grad_dtype");
  b.state0 = ptr<void>(state0);
  b.state1 = ptr<void>(state1);
  b.param_copy = ptr<void>(copy);
  b.copy_dtype = optim::parse_dtype(copy_dtype, "copy_dtype");
  b.numel = numel;
  return b;
}

using Ptrs = std::vector<uintptr_t>;
using Names = std::vector<std::string>;

// The buffers of a *_step_many call, given as one list per field (item i = entry i of
// each). state1s, copies and copy_dtypes may be empty (no second state, no copies).
std::vector<optim::StepBuffers> buffers_many(const Ptrs& params, const Ptrs& grads,
                                             const Names& grad_dtypes, const Ptrs& state0s,
                                             const Ptrs& state1s, const Ptrs& copies,
                                             const Names& copy_dtypes,
                                             const std::vector<int64_t>& numels,
                                             const Names& param_dtypes, const Names& state_dtypes) {
  const size_t n = params.size();
  auto check_len = [n](size_t len, const char* what, bool optional) {
    ZS_CHECK_VALUE(len == n || (optional && len == 0), what, ": expected ", n,
                   " entries (one per param); got ", len);
  };
  check_len(grads.size(), "grads", false);
  check_len(grad_dtypes.size(), "grad_dtypes", false);
  check_len(state0s.size(), "states", false);
  check_len(state1s.size(), "second states", true);
  check_len(copies.size(), "param_copies", true);
  check_len(copy_dtypes.size(), "copy_dtypes", true);
  check_len(numels.size(), "numels", false);
  check_len(param_dtypes.size(), "param_dtypes", true);
  check_len(state_dtypes.size(), "state_dtypes", true);
  std::vector<optim::StepBuffers> out(n);
  for (size_t i = 0; i < n; ++i) {
    out[i] = buffers(params[i], grads[i], grad_dtypes[i], state0s[i],
                     state1s.empty() ? 0 : state1s[i], copies.empty() ? 0 : copies[i],
                     copy_dtypes.empty() ? "bf16" : copy_dtypes[i], numels[i],
                     param_dtypes.empty() ? "fp32" : param_dtypes[i],
                     state_dtypes.empty() ? "fp32" : state_dtypes[i]);
  }
  return out;
}

// Keyword arguments shared by every *_step_many function, after the hyperparameters.
#define ZS_OPTIM_MANY_ARGS                                                                    \
  py::arg("param_copies") = Ptrs{}, py::arg("copy_dtypes") = Names{}, py::arg("threads") = 0, \
  py::arg("simd") = "", py::arg("nontemporal") = "auto", py::arg("param_dtypes") = Names{},   \
  py::arg("state_dtypes") = Names {}

// Keyword arguments shared by every step function, after the hyperparameters.
#define ZS_OPTIM_COMMON_ARGS                                                              \
  py::arg("param_copy") = 0, py::arg("copy_dtype") = "bf16", py::arg("threads") = 0,      \
  py::arg("simd") = "", py::arg("nontemporal") = "auto", py::arg("param_dtype") = "fp32", \
  py::arg("state_dtype") = "fp32"

void def_adam(py::module_& m) {
  m.def(
      "adam_step",
      [](uintptr_t param, uintptr_t grad, const std::string& grad_dtype, uintptr_t exp_avg,
         uintptr_t exp_avg_sq, int64_t numel, double lr, double beta1, double beta2, double eps,
         double weight_decay, bool bias_correction, bool adamw_mode, int64_t step,
         double grad_scale, uintptr_t copy, const std::string& copy_dtype, int threads,
         const std::string& simd, const std::string& nt, const std::string& param_dtype,
         const std::string& state_dtype) {
        optim::AdamParams p{lr,         beta1, beta2,     eps, weight_decay, bias_correction,
                            adamw_mode, step,  grad_scale};
        const auto b = buffers(param, grad, grad_dtype, exp_avg, exp_avg_sq, copy, copy_dtype,
                               numel, param_dtype, state_dtype);
        const auto run = run_options(threads, simd, nt);
        py::gil_scoped_release release;
        optim::adam_step(p, b, run);
      },
      "One fused Adam/AdamW step over raw buffers (see csrc/optim/adam.h).", py::arg("param"),
      py::arg("grad"), py::arg("grad_dtype"), py::arg("exp_avg"), py::arg("exp_avg_sq"),
      py::arg("numel"), py::kw_only(), py::arg("lr"), py::arg("beta1"), py::arg("beta2"),
      py::arg("eps"), py::arg("weight_decay"), py::arg("bias_correction"), py::arg("adamw_mode"),
      py::arg("step"), py::arg("grad_scale") = 1.0, ZS_OPTIM_COMMON_ARGS);
  m.def(
      "adam_step_many",
      [](const Ptrs& params, const Ptrs& grads, const Names& grad_dtypes, const Ptrs& exp_avgs,
         const Ptrs& exp_avg_sqs, const std::vector<int64_t>& numels,
         const std::vector<int64_t>& steps, double lr, double beta1, double beta2, double eps,
         double weight_decay, bool bias_correction, bool adamw_mode, double grad_scale,
         const Ptrs& copies, const Names& copy_dtypes, int threads, const std::string& simd,
         const std::string& nt, const Names& param_dtypes, const Names& state_dtypes) {
        ZS_CHECK_VALUE(steps.size() == params.size(), "steps: expected ", params.size(),
                       " entries (one per param); got ", steps.size());
        ZS_CHECK_VALUE(exp_avg_sqs.size() == params.size(), "exp_avg_sqs: expected ", params.size(),
                       " entries (one per param); got ", exp_avg_sqs.size());
        const auto b = buffers_many(params, grads, grad_dtypes, exp_avgs, exp_avg_sqs, copies,
                                    copy_dtypes, numels, param_dtypes, state_dtypes);
        std::vector<optim::AdamParams> p(params.size());
        for (size_t i = 0; i < p.size(); ++i) {
          p[i] = {lr,         beta1,    beta2,     eps, weight_decay, bias_correction,
                  adamw_mode, steps[i], grad_scale};
        }
        const auto run = run_options(threads, simd, nt);
        py::gil_scoped_release release;
        optim::adam_step_many(p, b, run);
      },
      "Fused Adam/AdamW steps of a list of tensors sharing hyperparameters (one step count "
      "each), in one parallel region (see csrc/optim/adam.h).",
      py::arg("params"), py::arg("grads"), py::arg("grad_dtypes"), py::arg("exp_avgs"),
      py::arg("exp_avg_sqs"), py::arg("numels"), py::arg("steps"), py::kw_only(), py::arg("lr"),
      py::arg("beta1"), py::arg("beta2"), py::arg("eps"), py::arg("weight_decay"),
      py::arg("bias_correction"), py::arg("adamw_mode"), py::arg("grad_scale") = 1.0,
      ZS_OPTIM_MANY_ARGS);
}

void def_adagrad_lion(py::module_& m) {
  m.def(
      "adagrad_step",
      [](uintptr_t param, uintptr_t grad, const std::string& grad_dtype, uintptr_t sum_sq,
         int64_t numel, double lr, double eps, double weight_decay, double grad_scale,
         uintptr_t copy, const std::string& copy_dtype, int threads, const std::string& simd,
         const std::string& nt, const std::string& param_dtype, const std::string& state_dtype) {
        optim::AdagradParams p{lr, eps, weight_decay, grad_scale};
        const auto b = buffers(param, grad, grad_dtype, sum_sq, 0, copy, copy_dtype, numel,
                               param_dtype, state_dtype);
        const auto run = run_options(threads, simd, nt);
        py::gil_scoped_release release;
        optim::adagrad_step(p, b, run);
      },
      "One fused Adagrad step over raw buffers (see csrc/optim/adagrad.h).", py::arg("param"),
      py::arg("grad"), py::arg("grad_dtype"), py::arg("sum_sq"), py::arg("numel"), py::kw_only(),
      py::arg("lr"), py::arg("eps"), py::arg("weight_decay"), py::arg("grad_scale") = 1.0,
      ZS_OPTIM_COMMON_ARGS);
  m.def(
      "adagrad_step_many",
      [](const Ptrs& params, const Ptrs& grads, const Names& grad_dtypes, const Ptrs& sum_sqs,
         const std::vector<int64_t>& numels, double lr, double eps, double weight_decay,
         double grad_scale, const Ptrs& copies, const Names& copy_dtypes, int threads,
         const std::string& simd, const std::string& nt, const Names& param_dtypes,
         const Names& state_dtypes) {
        const auto b = buffers_many(params, grads, grad_dtypes, sum_sqs, {}, copies, copy_dtypes,
                                    numels, param_dtypes, state_dtypes);
        const std::vector<optim::AdagradParams> p(params.size(),
                                                  {lr, eps, weight_decay, grad_scale});
        const auto run = run_options(threads, simd, nt);
        py::gil_scoped_release release;
        optim::adagrad_step_many(p, b, run);
      },
      "Fused Adagrad steps of a list of tensors in one parallel region (csrc/optim/adagrad.h).",
      py::arg("params"), py::arg("grads"), py::arg("grad_dtypes"), py::arg("sum_sqs"),
      py::arg("numels"), py::kw_only(), py::arg("lr"), py::arg("eps"), py::arg("weight_decay"),
      py::arg("grad_scale") = 1.0, ZS_OPTIM_MANY_ARGS);
  m.def(
      "lion_step",
      [](uintptr_t param, uintptr_t grad, const std::string& grad_dtype, uintptr_t exp_avg,
         int64_t numel, double lr, double beta1, double beta2, double weight_decay,
         double grad_scale, uintptr_t copy, const std::string& copy_dtype, int threads,
         const std::string& simd, const std::string& nt, const std::string& param_dtype,
         const std::string& state_dtype) {
        optim::LionParams p{lr, beta1, beta2, weight_decay, grad_scale};
        const auto b = buffers(param, grad, grad_dtype, exp_avg, 0, copy, copy_dtype, numel,
                               param_dtype, state_dtype);
        const auto run = run_options(threads, simd, nt);
        py::gil_scoped_release release;
        optim::lion_step(p, b, run);
      },
      "One fused Lion step over raw buffers (see csrc/optim/lion.h).", py::arg("param"),
      py::arg("grad"), py::arg("grad_dtype"), py::arg("exp_avg"), py::arg("numel"), py::kw_only(),
      py::arg("lr"), py::arg("beta1"), py::arg("beta2"), py::arg("weight_decay"),
      py::arg("grad_scale") = 1.0, ZS_OPTIM_COMMON_ARGS);
  m.def(
      "lion_step_many",
      [](const Ptrs& params, const Ptrs& grads, const Names& grad_dtypes, const Ptrs& exp_avgs,
         const std::vector<int64_t>& numels, double lr, double beta1, double beta2,
         double weight_decay, double grad_scale, const Ptrs& copies, const Names& copy_dtypes,
         int threads, const std::string& simd, const std::string& nt, const Names& param_dtypes,
         const Names& state_dtypes) {
        const auto b = buffers_many(params, grads, grad_dtypes, exp_avgs, {}, copies, copy_dtypes,
                                    numels, param_dtypes, state_dtypes);
        const std::vector<optim::LionParams> p(params.size(),
                                               {lr, beta1, beta2, weight_decay, grad_scale});
        const auto run = run_options(threads, simd, nt);
        py::gil_scoped_release release;
        optim::lion_step_many(p, b, run);
      },
      "Fused Lion steps of a list of tensors in one parallel region (csrc/optim/lion.h).",
      py::arg("params"), py::arg("grads"), py::arg("grad_dtypes"), py::arg("exp_avgs"),
      py::arg("numels"), py::kw_only(), py::arg("lr"), py::arg("beta1"), py::arg("beta2"),
      py::arg("weight_decay"), py::arg("grad_scale") = 1.0, ZS_OPTIM_MANY_ARGS);
}

void def_stats_and_probe(py::module_& m) {
  m.def(
      "grad_stats",
      [](uintptr_t grad, const std::string& dtype, int64_t numel, double scale, int threads,
         const std::string& simd) {
        const DType t = optim::parse_dtype(dtype, "dtype");
        const auto run = run_options(threads, simd, "auto");
        optim::GradStats s;
        {
          py::gil_scoped_release release;
          s = optim::grad_stats(ptr<const void>(grad), t, numel, scale, run);
        }
        return std::make_pair(s.sum_squares, s.finite);
      },
      "(sum of squares of grad*scale in double, all finite) in one pass (csrc/optim/grad_stats.h).",
      py::arg("grad"), py::arg("dtype"), py::arg("numel"), py::kw_only(), py::arg("scale") = 1.0,
      py::arg("threads") = 0, py::arg("simd") = "");
  m.def(
      "roofline_pass",
      [](uintptr_t p, uintptr_t mm, uintptr_t v, uintptr_t grad, int grad_bytes, uintptr_t copy,
         int64_t numel, int threads, const std::string& simd, const std::string& nt) {
        const optim::RooflineBuffers b{ptr<float>(p),         ptr<float>(mm), ptr<float>(v),
                                       ptr<const void>(grad), grad_bytes,     ptr<void>(copy)};
        const auto run = run_options(threads, simd, nt);
        py::gil_scoped_release release;
        optim::roofline_pass(b, numel, run);
      },
      "One pass of the memory-roofline probe (csrc/optim/roofline.h).", py::arg("p"), py::arg("m"),
      py::arg("v"), py::arg("grad"), py::arg("grad_bytes"), py::arg("copy"), py::arg("numel"),
      py::kw_only(), py::arg("threads") = 0, py::arg("simd") = "", py::arg("nontemporal") = "on");
  m.def(
      "simd_level",
      [](const std::string& simd) {
        return std::string(simd_level_name(optim::resolve_simd_level(
            simd.empty() ? -1 : static_cast<int>(parse_simd_level(simd)))));
      },
      "The level a call with this `simd` request runs at (capped by the CPU and ZS_SIMD).",
      py::arg("simd") = "");
}

}  // namespace

void init_optim_bindings(py::module_& m) {
  py::module_ sub = m.def_submodule("optim", "Fused CPU optimizers (csrc/optim)");
  def_adam(sub);
  def_adagrad_lion(sub);
  def_stats_and_probe(sub);
}

}  // namespace zs::bindings
