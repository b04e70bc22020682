// "auto" and derived values. DeepSpeed itself only drops "auto" in its pydantic sections
// (meaning: default) and leaves the rest to HF Trainer; zerostream resolves what the run
// can tell (hidden size, dtype, lr, steps) and otherwise uses DeepSpeed's default, saying so.
#include <algorithm>
#include <cctype>

#include "config/resolve.h"
#include "config/text_util.h"

namespace zs::config {
namespace {

// The schema entry for a dotted path, following the optimizer/scheduler type.
const Key* key_spec(const Resolution& r, const std::string& path) {
  const std::vector<std::string> parts = split_path(path);
  const Section* section = &root_schema();
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i == 2 && parts[1] == "params") {
      const Json& type = r.at(parts[0] + ".type");
      if (!type.is_string()) return nullptr;
      section = parts[0] == "optimizer" ? optimizer_params_schema(lower(type.get<std::string>()))
                                        : scheduler_params_schema(type.get<std::string>());
      if (section == nullptr) return nullptr;
    }
    const Key* k = section->find(parts[i]);
    if (k == nullptr) return nullptr;
    if (i + 1 == parts.size()) return k;
    if (k->kind != Kind::kSection && !(i == 1 && parts[1] == "params")) return nullptr;
    if (k->kind == Kind::kSection) section = k->section;
  }
  return nullptr;
}

// Values the run can supply for an "auto" key; null when it cannot.
Json from_run(const std::string& path, const RunContext& c, std::string& why) {
  const int64_t h = c.hidden_size.value_or(0);
  if (h > 0) {
    why = "hidden size " + std::to_string(h);
    if (path == "zero_optimization.reduce_bucket_size") return h * h;
    if (path == "zero_optimization.stage3_prefetch_bucket_size")
      return static_cast<int64_t>(0.9 * static_cast<double>(h) * static_cast<double>(h));
    if (path == "zero_optimization.stage3_param_persistence_threshold") return 10 * h;
  }
  if (c.model_dtype) {
    why = "model dtype " + *c.model_dtype;
    if (path == "fp16.enabled") return *c.model_dtype == "fp16";
    if (path == "bf16.enabled") return *c.model_dtype == "bf16";
  }
  if (c.lr) {
    why = "the run's learning rate";
    if (path == "optimizer.params.lr" || path == "scheduler.params.warmup_max_lr") return *c.lr;
  }
  if (c.total_num_steps) {
    why = "the run's total steps";
    if (path == "scheduler.params.total_num_steps") return *c.total_num_steps;
  }
  return nullptr;
}

bool is_batch_key(const std::string& path) {
  return path == "train_batch_size" || path == "train_micro_batch_size_per_gpu" ||
         path == "gradient_accumulation_steps";
}

void resolve_auto(Resolution& r, const RunContext& c) {
  std::vector<std::string> pending;
  for (const auto& [path, origin] : r.origins)
    if (origin == Origin::kAuto && !is_batch_key(path)) pending.push_back(path);
  for (const std::string& path : pending) {
    std::string why;
    Json v = from_run(path, c, why);
    if (!v.is_null()) {
      r.set(path, v, Origin::kAuto);
      r.notes.push_back(path + ": \"auto\" -> " + show(v) + " (from " + why + ")");
      continue;
    }
    const Key* k = key_spec(r, path);
    if (k != nullptr && !k->required) {
      r.set(path, k->default_value, Origin::kAuto);
      r.notes.push_back(path + ": \"auto\" -> " + show(k->default_value) +
                        " (DeepSpeed's default; nothing in this run determines it)");
    } else {
      r.set(path, nullptr, Origin::kAuto);
      r.warnings.push_back(path +
                           ": \"auto\" cannot be resolved without the run and has no "
                           "default; initialize() must receive it (it fails if still unknown)");
    }
  }
}

void derive(Resolution& r) {
  if (r.at("zero_optimization.overlap_comm").is_null()) {
    const bool on = r.at("zero_optimization.stage") == 3;
    r.set("zero_optimization.overlap_comm", on, Origin::kDerived);
    r.notes.push_back(std::string("zero_optimization.overlap_comm: ") + (on ? "true" : "false") +
                      " (DeepSpeed's rule: true for stage 3 only)");
  }
  if (r.at("communication_data_type").is_null()) {
    const char* dtype = r.at("fp16.enabled") == true   ? "fp16"
                        : r.at("bf16.enabled") == true ? "bf16"
                                                       : "fp32";
    r.set("communication_data_type", dtype, Origin::kDerived);
  }
  const Json& oo = r.at("zero_optimization.offload_optimizer");
  if (oo.is_object() && oo["pipeline"] == false &&
      (oo["pipeline_read"] == true || oo["pipeline_write"] == true)) {
    r.set("zero_optimization.offload_optimizer.pipeline", true, Origin::kDerived);
  }
}

}  // namespace

void resolve_auto_and_derived(Resolution& r, const RunContext& c) {
  resolve_auto(r, c);
  derive(r);
}

}  // namespace zs::config
