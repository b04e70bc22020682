// optimizer and scheduler sections: DeepSpeed reads them as plain dicts and passes `params`
// as keyword arguments, so a wrong key only fails when the object is built. zerostream checks
// the names and the parameters of the types it knows at load time instead.
#include <algorithm>
#include <cctype>

#include "config/resolve.h"
#include "config/text_util.h"

namespace zs::config {
namespace {

bool contains(const std::vector<std::string>& names, const std::string& n) {
  return std::find(names.begin(), names.end(), n) != names.end();
}

bool contains_any_case(const std::vector<std::string>& names, const std::string& n) {
  return std::any_of(names.begin(), names.end(),
                     [&](const std::string& x) { return lower(x) == lower(n); });
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) out += (i ? ", " : "") + names[i];
  return out;
}

void check_optimizer(Resolution& r) {
  const Json opt = r.at("optimizer");
  if (opt.is_null()) return;
  const Json& type = opt["type"];
  if (!type.is_string()) {
    r.errors.push_back(
        "optimizer.type: required when an optimizer section is given (e.g. "
        "\"AdamW\"); got " +
        show(type));
    return;
  }
  const std::string name = type.get<std::string>();
  const std::string low = lower(name);
  const auto& ds = deepspeed_optimizer_names();
  const auto& torch_names = torch_optimizer_names();
  const bool deepspeed_type = contains_any_case(ds, low);
  if (!deepspeed_type && !contains(torch_names, name)) {
    std::vector<std::string> all = ds;
    all.insert(all.end(), torch_names.begin(), torch_names.end());
    const std::string guess = closest_match(name, all);
    r.errors.push_back("optimizer.type: expected a DeepSpeed optimizer (" + join(ds) +
                       ", any case) or a torch.optim class name; got " + show(type) +
                       (guess.empty() ? "" : "; did you mean \"" + guess + "\"?"));
    return;
  }
  const Json& params = opt["params"];
  if (!params.is_object()) {
    r.errors.push_back("optimizer.params: expected an object of keyword arguments; got " +
                       show(params));
    return;
  }
  if (deepspeed_type && !zerostream_implements_optimizer(low)) {
    r.warnings.push_back("optimizer.type: \"" + name +
                         "\" is a DeepSpeed optimizer that "
                         "zerostream does not implement; initialize() raises "
                         "NotImplementedError unless the script passes its own optimizer");
  }
  const Section* spec = optimizer_params_schema(deepspeed_type ? low : lower(name));
  if (!deepspeed_type && name != "SGD") spec = nullptr;
  if (spec != nullptr) {
    // max_grad_norm is no optimizer argument; rules.cpp compares it with gradient_clipping.
    Json kwargs = params;
    kwargs.erase("max_grad_norm");
    walk_section(*spec, kwargs, "optimizer.params", r);
    if (params.contains("max_grad_norm"))
      r.set("optimizer.params.max_grad_norm", params["max_grad_norm"], Origin::kFile);
  }
  if (r.at("optimizer.params.amsgrad") == true) {
    r.warnings.push_back(
        "optimizer.params.amsgrad: true is not supported by the CPU Adam "
        "kernels (DeepSpeed's neither); initialize() raises NotImplementedError");
  }
}

void check_scheduler(Resolution& r) {
  const Json sched = r.at("scheduler");
  if (sched.is_null()) return;
  const Json& type = sched["type"];
  if (!type.is_string()) {
    r.errors.push_back(
        "scheduler.type: required when a scheduler section is given (e.g. "
        "\"WarmupLR\"); got " +
        show(type));
    return;
  }
  const std::string name = type.get<std::string>();
  const auto& ds = deepspeed_scheduler_names();
  const auto& torch_names = torch_scheduler_names();
  if (!contains(ds, name) && !contains(torch_names, name)) {
    std::vector<std::string> all = ds;
    all.insert(all.end(), torch_names.begin(), torch_names.end());
    const std::string guess = closest_match(name, all);
    r.errors.push_back("scheduler.type: expected one of " + join(ds) +
                       " or a torch.optim.lr_scheduler class name (exact case); got " + show(type) +
                       (guess.empty() ? "" : "; did you mean \"" + guess + "\"?"));
    return;
  }
  const Json& params = sched["params"];
  if (!params.is_object()) {
    r.errors.push_back("scheduler.params: required, as an object (it may be {}); got " +
                       show(params));
    return;
  }
  if (const Section* spec = scheduler_params_schema(name)) {
    walk_section(*spec, params, "scheduler.params", r);
    for (const Key& k : spec->keys) {
      if (k.required && !params.contains(k.name))
        r.errors.push_back("scheduler.params." + k.name + ": required by " + name);
    }
  }
}

}  // namespace

void check_optimizer_and_scheduler(Resolution& r) {
  check_optimizer(r);
  check_scheduler(r);
}

}  // namespace zs::config
