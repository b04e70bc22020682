// Cross-field rules, checked once at load. Errors are the ones DeepSpeed raises (as
// assertions, often much later); warnings are what DeepSpeed silently ignores.
#include <algorithm>
#include <vector>

#include "config/resolve.h"
#include "config/text_util.h"

namespace zs::config {
namespace {

bool on(const Resolution& r, const std::string& path) { return r.at(path) == true; }

int64_t integer(const Resolution& r, const std::string& path) {
  const Json& v = r.at(path);
  return v.is_number() ? v.get<int64_t>() : 0;
}

std::string str(const Resolution& r, const std::string& path) {
  const Json& v = r.at(path);
  return v.is_string() ? v.get<std::string>() : "";
}

// "fp32", "fp16" or "bf16" for any of DeepSpeed's dtype spellings (schema's kDtypes).
std::string short_dtype(const std::string& name) {
  if (name == "fp16" || name == "float16" || name == "half" || name == "torch.float16")
    return "fp16";
  if (name == "bf16" || name == "bfloat16" || name == "torch.bfloat16") return "bf16";
  return "fp32";
}

void precision_rules(Resolution& r, int64_t stage) {
  if (on(r, "fp16.enabled") && on(r, "bf16.enabled"))
    r.errors.push_back(
        "fp16.enabled, bf16.enabled: bfloat16 and fp16 modes cannot be "
        "simultaneously enabled");
  if (on(r, "fp16.enabled") && r.at("fp16.loss_scale") == 0.0) {
    if (integer(r, "fp16.loss_scale_window") <= 0)
      r.errors.push_back("fp16.loss_scale_window: must be > 0 with dynamic loss scaling; got " +
                         show(r.at("fp16.loss_scale_window")));
    if (integer(r, "fp16.min_loss_scale") <= 0)
      r.errors.push_back("fp16.min_loss_scale: must be > 0 with dynamic loss scaling; got " +
                         show(r.at("fp16.min_loss_scale")));
    // The scaler lowers the scale only once the hysteresis counter reaches 1.
    if (integer(r, "fp16.hysteresis") <= 0)
      r.errors.push_back("fp16.hysteresis: must be > 0 with dynamic loss scaling; got " +
                         show(r.at("fp16.hysteresis")));
    // 2^power multiplies the fp32 loss: it must stay a finite, normal float.
    const int64_t power = integer(r, "fp16.initial_scale_power");
    if (power < -126 || power > 127)
      r.errors.push_back(
          "fp16.initial_scale_power: must be in [-126, 127] with dynamic loss "
          "scaling (2^power scales the fp32 loss); got " +
          show(r.at("fp16.initial_scale_power")));
  }
  // 16-bit master weights (DeepSpeed >= 0.18.3). bf16: implemented with and without an
  // offloaded optimizer (python/zerostream/zero/master_precision.py). fp16: refused by name
  // where DeepSpeed would accept it, never accepted and ignored.
  const std::string od = str(r, "zero_optimization.offload_optimizer.device");
  const bool opt_offloaded = od == "cpu" || od == "nvme";
  if (on(r, "fp16.fp16_master_weights_and_grads") && !(stage >= 1 && od == "cpu"))
    r.errors.push_back(
        "fp16.fp16_master_weights_and_grads: needs ZeRO stage 1-3 with "
        "zero_optimization.offload_optimizer.device \"cpu\"");
  else if (on(r, "fp16.fp16_master_weights_and_grads"))
    r.errors.push_back(
        "fp16.fp16_master_weights_and_grads: fp16 master weights in the offloaded CPU optimizer "
        "are not supported by zerostream yet (bf16.bf16_master_weights_and_grads is); "
        "remove the key");
  const bool bf16_master = on(r, "bf16.bf16_master_weights_and_grads");
  if (bf16_master && stage == 0)
    r.errors.push_back("bf16.bf16_master_weights_and_grads: needs ZeRO stage 1-3; got stage 0");
  if (on(r, "bf16.bf16_optimizer_states") && !bf16_master)
    r.errors.push_back("bf16.bf16_optimizer_states: needs bf16.bf16_master_weights_and_grads");
  if (bf16_master && stage >= 1 && !opt_offloaded && !on(r, "bf16.bf16_optimizer_states"))
    r.errors.push_back(
        "bf16.bf16_master_weights_and_grads: without an offloaded optimizer it needs "
        "bf16.bf16_optimizer_states true as well (DeepSpeed keeps fp32 moments beside bf16 "
        "weights only in its offloaded CPU Adam)");
  if (bf16_master && !on(r, "bf16.enabled"))
    r.warnings.push_back(
        "bf16.bf16_master_weights_and_grads: has no effect while bf16.enabled is false");
  const std::string model = on(r, "fp16.enabled")   ? "fp16"
                            : on(r, "bf16.enabled") ? "bf16"
                                                    : "fp32";
  const std::string pd = str(r, "data_types.param_dtype");
  if (!pd.empty() && short_dtype(pd) != model)
    r.errors.push_back("data_types.param_dtype: \"" + pd +
                       "\" does not match the enabled "
                       "precision (" +
                       model + ")");
  // Stage 0 adds micro-steps' gradients up in param.grad, in the model's dtype; DeepSpeed's
  // initialize() raises NotImplementedError for any other there ("unsupported mix of
  // model_dtype and grad_accum_dtype"), and so does zerostream's (unsupported.py).
  const std::string ga = str(r, "data_types.grad_accum_dtype");
  if (stage == 0 && !ga.empty() && short_dtype(ga) != model)
    r.warnings.push_back("data_types.grad_accum_dtype: \"" + ga + "\" with the model in " + model +
                         " needs ZeRO stage 1-3 (stage 0 accumulates gradients in the model's "
                         "dtype); initialize() raises NotImplementedError while it is set");
}

void offload_rules(Resolution& r, int64_t stage) {
  for (const char* which : {"offload_optimizer", "offload_param"}) {
    const std::string base = std::string("zero_optimization.") + which;
    if (!r.at(base).is_object()) continue;
    const std::string device = str(r, base + ".device");
    const Json& path = r.at(base + ".nvme_path");
    if (device == "nvme" && path.is_null())
      r.errors.push_back(base + ".nvme_path: required when " + base +
                         ".device is \"nvme\" (a directory on the NVMe drive)");
    // An empty path would put swap files in the current directory; a NUL byte would be cut
    // off silently by every system call that takes the path.
    if (path.is_string() && path.get_ref<const std::string&>().empty())
      r.errors.push_back(base + ".nvme_path: empty; give a directory on the NVMe drive");
    if (path.is_string() && path.get_ref<const std::string&>().find('\0') != std::string::npos)
      r.errors.push_back(base + ".nvme_path: contains a NUL byte (\\u0000); not a usable path");
  }
  const std::string param_device = str(r, "zero_optimization.offload_param.device");
  if (!param_device.empty() && param_device != "none" && stage != 3)
    r.warnings.push_back(
        "zero_optimization.offload_param: only ZeRO stage 3 partitions "
        "parameters, so offload_param (device \"" +
        param_device + "\") has no effect at stage " + std::to_string(stage) +
        " (DeepSpeed ignores it too)");
  const std::string opt_device = str(r, "zero_optimization.offload_optimizer.device");
  if (!opt_device.empty() && opt_device != "none" && stage == 0)
    r.warnings.push_back(
        "zero_optimization.offload_optimizer: ZeRO stage 0 keeps the optimizer "
        "with the model, so offload_optimizer (device \"" +
        opt_device + "\") has no effect; use stage 1, 2 or 3 to offload it");
  const Json& ratio = r.at("zero_optimization.offload_optimizer.ratio");
  if (ratio.is_number() && ratio.get<double>() < 1.0 && stage != 3)
    r.errors.push_back("zero_optimization.offload_optimizer.ratio: partial offloading (" +
                       show(ratio) + " < 1) is only supported for ZeRO stage 3; got stage " +
                       std::to_string(stage));
  // zerostream.optimizer_max_on_device: the device tier as elements or "auto"
  // (python/zerostream/offload/device_auto.py); one way of sizing it at a time.
  const bool partial = ratio.is_number() && ratio.get<double>() < 1.0;
  const Json& on_device = r.at("zerostream.optimizer_max_on_device");
  const bool wants_device = !on_device.is_null() && on_device != 0;
  if (wants_device && partial)
    r.errors.push_back("zerostream.optimizer_max_on_device: " + show(on_device) +
                       " and zero_optimization.offload_optimizer.ratio " + show(ratio) +
                       " both size the optimizer state kept on the device; set one of them");
  else if (wants_device && stage == 0)
    r.errors.push_back("zerostream.optimizer_max_on_device: " + show(on_device) +
                       " keeps part of an offloaded optimizer's sub-groups on the device, under "
                       "ZeRO stages 1-3; got stage 0");
  else if (wants_device && opt_device != "cpu" && opt_device != "nvme")
    r.warnings.push_back("zerostream.optimizer_max_on_device: " + show(on_device) +
                         " has no effect: zero_optimization.offload_optimizer.device is \"" +
                         (opt_device.empty() ? "none" : opt_device) +
                         "\", so all of the optimizer state is on the device already");
  if (str(r, "zerostream.device_tier_grads") == "host" && !partial && !wants_device)
    r.warnings.push_back(
        "zerostream.device_tier_grads: \"host\" has no effect: it places the gradients of the "
        "optimizer sub-groups zero_optimization.offload_optimizer.ratio (or "
        "zerostream.optimizer_max_on_device) keeps on the device, and neither is set");
  const Json& in_cpu = r.at("zerostream.optimizer_max_in_cpu");
  if (opt_device != "nvme" && in_cpu != 0)
    r.warnings.push_back("zerostream.optimizer_max_in_cpu: " + show(in_cpu) +
                         " has no effect: it splits optimizer state offloaded to NVMe between "
                         "host memory and disk, and zero_optimization.offload_optimizer.device "
                         "is \"" +
                         (opt_device.empty() ? "none" : opt_device) + "\"");
  if (str(r, "zero_optimization.offload_optimizer.device") == "nvme" && (stage == 1 || stage == 2))
    r.notes.push_back("zero_optimization.offload_optimizer.device: \"nvme\" at stage " +
                      std::to_string(stage) +
                      " keeps optimizer states on NVMe (DeepSpeed "
                      "would silently use CPU memory instead)");
  // zerostream.overlap_step "next_forward" (python/zerostream/zero/overlap.py): the offloaded
  // CPU update (offload_optimizer cpu, or nvme's sub-group pipeline) runs on a thread of its
  // own while the next forward gathers ZeRO-3 shards (from offload_param nvme too).
  // "backward" starts it during the backward too (python/zerostream/zero/speculate.py) and,
  // at stage 3, goes on behind the next forward; at stage 2 (whose buckets land during the
  // backward too) step() finishes it.
  const std::string overlap = str(r, "zerostream.overlap_step");
  if (overlap == "next_forward" || overlap == "backward") {
    const std::string key = "zerostream.overlap_step: \"" + overlap + "\" ";
    if (overlap == "next_forward" && stage != 3)
      r.errors.push_back(key +
                         "overlaps the offloaded optimizer step with the next forward's ZeRO-3 "
                         "gathers, which wait for the shards they read; got stage " +
                         std::to_string(stage) + " (set zero_optimization.stage to 3)");
    else if (overlap == "backward" && stage != 2 && stage != 3)
      r.errors.push_back(key +
                         "starts the offloaded update on gradients the backward has reduced, "
                         "at ZeRO stages 2 and 3; got stage " +
                         std::to_string(stage) +
                         (stage == 1 ? " (stage 1 reduces the gradients at the step, so nothing "
                                       "lands during the backward)"
                                     : ""));
    else if (opt_device != "cpu" && !(overlap == "next_forward" && opt_device == "nvme"))
      r.errors.push_back(
          key + "runs the CPU optimizer update " +
          (overlap == "backward" ? "during the backward, with zero_optimization.offload_optimizer"
                                   ".device \"cpu\""
                                 : "behind the next forward, with zero_optimization."
                                   "offload_optimizer.device \"cpu\" or \"nvme\"") +
          "; got \"" + (opt_device.empty() ? std::string("none") : opt_device) + "\"" +
          (opt_device == "nvme" ? " (the NVMe sub-group pipeline runs behind the next forward: "
                                  "use \"next_forward\")"
                                : ""));
    else if (partial || wants_device)
      r.errors.push_back(key +
                         "is not built with optimizer sub-groups on the device "
                         "(zero_optimization.offload_optimizer.ratio or "
                         "zerostream.optimizer_max_on_device)");
    else if (overlap == "backward" && r.at("zero_optimization.zenflow").is_object())
      r.errors.push_back(key +
                         "is not built with zero_optimization.zenflow, whose own update "
                         "writes the state the speculation would put back (ZenFlow has its "
                         "own zenflow.overlap_step)");
    else if (overlap == "backward" && !on(r, "managed_gradient_accumulation"))
      r.errors.push_back(key +
                         "needs the engine to know which backward ends the accumulation; with "
                         "managed_gradient_accumulation false the caller's step() decides, so "
                         "nothing could start during the backward (drop one of them)");
  }
  if (on(r, "aio.use_gds"))
    r.warnings.push_back(
        "aio.use_gds: GPUDirect Storage is not supported by zerostream; "
        "NVMe I/O goes through host memory with io_uring");
}

// zero_optimization.leaf_module (DeepSpeed 0.18): classes, names and name_suffixes, each a
// string or a list of strings. Checked here so that `zerostream config check` sees what
// initialize() would refuse (zero/stage3/leaf.py reads the section).
void leaf_module_rule(Resolution& r) {
  const std::string key = "zero_optimization.leaf_module";
  const Json& leaf = r.at(key);
  if (leaf.is_null()) return;
  if (!leaf.is_object()) {
    r.errors.push_back(key + ": expected an object with classes, names and name_suffixes; got " +
                       show(leaf));
    return;
  }
  for (const auto& [name, value] : leaf.items()) {
    if (name != "classes" && name != "names" && name != "name_suffixes") {
      r.errors.push_back(key + "." + name +
                         ": unknown key; expected one of classes, names, name_suffixes");
      continue;
    }
    bool ok = value.is_string() || value.is_array();
    if (value.is_array())
      for (const Json& item : value) ok = ok && item.is_string();
    if (!ok)
      r.errors.push_back(key + "." + name + ": expected a string or a list of strings; got " +
                         show(value));
  }
}

// log_level: the name of a logging level, in any case, as DeepSpeed's logger.setLevel takes.
void log_level_rule(Resolution& r) {
  const std::string level = lower(str(r, "log_level"));
  if (r.at("log_level").is_null()) return;
  if (level != "debug" && level != "info" && level != "warning" && level != "error" &&
      level != "critical")
    r.errors.push_back(
        "log_level: expected one of debug, info, warning, error, critical (any "
        "case); got " +
        show(r.at("log_level")));
}

void zero_rules(Resolution& r, int64_t stage) {
  leaf_module_rule(r);
  log_level_rule(r);
  const std::string z = "zero_optimization.";
  const bool reduce_scatter = on(r, z + "reduce_scatter");
  if (stage >= 2 && reduce_scatter && on(r, "prescale_gradients"))
    r.errors.push_back("prescale_gradients: must be false with zero_optimization.stage " +
                       std::to_string(stage) +
                       " and reduce_scatter true (DeepSpeed asserts "
                       "this too); set one of them false");
  if (stage >= 2 && reduce_scatter && r.at("gradient_predivide_factor") != 1.0)
    r.errors.push_back("gradient_predivide_factor: must be 1.0 with zero_optimization.stage " +
                       std::to_string(stage) + " and reduce_scatter true; got " +
                       show(r.at("gradient_predivide_factor")));
  if (str(r, "gradient_allreduce_op") == "sum") {
    if (stage == 3)
      r.errors.push_back("gradient_allreduce_op: \"sum\" is not supported with ZeRO stage 3");
    if (r.at(z + "zenflow").is_object())
      r.errors.push_back("gradient_allreduce_op: \"sum\" is not supported with ZenFlow");
    if (on(r, "compile.deepcompile"))
      r.errors.push_back("gradient_allreduce_op: \"sum\" is not supported with DeepCompile");
  }
  if (on(r, z + "legacy_stage1"))
    r.errors.push_back(
        "zero_optimization.legacy_stage1: the deprecated ZeRO stage 1 is not "
        "supported (DeepSpeed dropped it in 0.5.9)");
  if ((stage == 1 || stage == 2) && integer(r, z + "allgather_bucket_size") % 2 != 0)
    r.errors.push_back(
        "zero_optimization.allgather_bucket_size: must be a multiple of 2 at "
        "stage 1/2 (DeepSpeed: allgather_bucket_size must be a multiple of "
        "nccl_start_alignment_factor, 2); got " +
        show(r.at(z + "allgather_bucket_size")));
  if (stage == 3 && on(r, z + "elastic_checkpoint"))
    r.warnings.push_back(
        "zero_optimization.elastic_checkpoint: elastic checkpointing is deprecated at stage 3 "
        "(DeepSpeed no longer supports it either); save_checkpoint() raises "
        "NotImplementedError while it is true");
  struct Feature {
    std::string key;
    bool used;
  };
  const Feature unsupported[] = {
      {z + "zero_quantized_weights", on(r, z + "zero_quantized_weights")},
      {z + "zero_quantized_nontrainable_weights", on(r, z + "zero_quantized_nontrainable_weights")},
      {z + "zero_quantized_gradients", on(r, z + "zero_quantized_gradients")},
      {z + "zero_hpz_partition_size", integer(r, z + "zero_hpz_partition_size") > 1},
      {z + "mics_shard_size", integer(r, z + "mics_shard_size") > 0},
      {z + "offload_optimizer.super_offload", on(r, z + "offload_optimizer.super_offload")},
      {"compile.deepcompile", on(r, "compile.deepcompile")},
  };
  for (const Feature& f : unsupported)
    if (f.used)
      r.warnings.push_back(f.key +
                           ": this DeepSpeed feature is not implemented by zerostream; "
                           "initialize() raises NotImplementedError while it is set");
}

// DeepSpeed's engine raises on optimizer.params.max_grad_norm. When it equals the resolved
// gradient_clipping it is redundant, so zerostream drops it with a warning; otherwise the
// user must say which clipping they meant.
void max_grad_norm_rule(Resolution& r) {
  const Json& mgn = r.at("optimizer.params.max_grad_norm");
  if (mgn.is_null()) return;
  const Json& clip = r.at("gradient_clipping");
  if (mgn.is_number() && clip.is_number() && mgn.get<double>() == clip.get<double>()) {
    r.warnings.push_back(
        "optimizer.params.max_grad_norm: not an optimizer parameter; ignored "
        "because it equals gradient_clipping (" +
        show(clip) + ")");
  } else {
    r.errors.push_back("optimizer.params.max_grad_norm: not an optimizer parameter, and " +
                       show(mgn) + " differs from gradient_clipping " + show(clip) +
                       "; set the clipping norm with the top-level \"gradient_clipping\" key");
  }
}

// `section.enabled` of a pass-through section, null when absent. Json::value("enabled", false)
// threw nlohmann's type_error (a RuntimeError in Python) when the file had a string there.
const Json& enabled_of(const Json& section) {
  static const Json kAbsent;
  if (!section.is_object()) return kAbsent;
  const auto it = section.find("enabled");
  return it == section.end() ? kAbsent : *it;
}

void feature_rules(Resolution& r, int64_t stage) {
  const Json& amp = r.at("amp");
  if (enabled_of(amp) == true && stage > 0)
    r.errors.push_back("amp.enabled: Apex AMP and ZeRO are not compatible (stage " +
                       std::to_string(stage) + "); use fp16 or bf16 instead");
  const std::string type = str(r, "optimizer.type");
  const std::string low = lower(type);
  if ((low == "onebitadam" || low == "zerooneadam" || low == "onebitlamb") && stage > 0)
    r.errors.push_back("optimizer.type: \"" + type + "\" is not compatible with ZeRO (stage " +
                       std::to_string(stage) + ")");
  // DeepSpeed 0.19 pads each parameter in its stage 1/2 flat buffer to 16 bytes when asked;
  // zerostream's flat layout is its own, and checkpoints are re-cut by parameter name on load,
  // so DeepSpeed's padded checkpoints load either way.
  if (r.at("zero_optimization.parameter_alignment") == true)
    r.warnings.push_back(
        "zero_optimization.parameter_alignment: accepted; zerostream keeps its own flat "
        "layout (checkpoints saved by DeepSpeed with or without it load the same)");
  const Json& prof_ops = r.at("comms_logger.prof_ops");
  const bool names = prof_ops.is_array() &&
                     std::all_of(prof_ops.begin(), prof_ops.end(),
                                 [](const Json& op) { return op.is_string(); });
  if (!names)
    r.errors.push_back(
        "comms_logger.prof_ops: expected a list of collective names (strings such as "
        "\"all_reduce\"); got " +
        show(prof_ops));
  // Sections of DeepSpeed features that zerostream accepts but does not implement.
  for (const Key& k : root_schema().keys) {
    if (k.kind != Kind::kAny || k.deprecation != Deprecation::kNone) continue;
    // Implemented in Python before the batch rule (zerostream/elasticity.py).
    if (k.name == "elasticity") continue;
    const Json& v = r.at(k.name);
    if (v.is_null() || enabled_of(v) == false) continue;
    r.warnings.push_back(k.name +
                         ": accepted for compatibility, but zerostream does not "
                         "implement this DeepSpeed feature; it has no effect");
  }
  for (const Key& k : root_schema().keys) {
    if (k.kind != Kind::kSection || k.section->implemented) continue;
    if (r.at(k.name + ".enabled") == true)
      r.warnings.push_back(k.name +
                           ".enabled: zerostream does not implement this DeepSpeed "
                           "feature; it has no effect");
  }
}

// checkpoint.writer: DeepSpeed's checkpoint engines (mock, python or fast writers, decoupled
// saves, data-parallel writing). zerostream writes every checkpoint with its own writer
// (staged O_DIRECT writes, fsynced, committed by rename), so the section's values are checked
// and said to change nothing; "mock" (no bytes written) and "decoupled" (save returns before
// the files are written) are named, since a script may rely on them.
void checkpoint_writer_rule(Resolution& r) {
  const Json& w = r.at("checkpoint.writer");
  if (w.is_null()) return;
  if (!w.is_object()) {
    r.errors.push_back("checkpoint.writer: expected an object (DeepSpeed's writer section); got " +
                       show(w));
    return;
  }
  const auto fail = [&](const std::string& key, const std::string& want, const Json& v) {
    r.errors.push_back("checkpoint.writer." + key + ": expected " + want + "; got " + show(v));
  };
  const std::vector<std::string> known = {
      "type",          "decoupled",    "io_buffer_size", "io_buffer_double", "show_statistics",
      "data_parallel", "io_multiplier"};
  for (const auto& [key, v] : w.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      r.errors.push_back("checkpoint.writer." + key +
                         ": unknown key (DeepSpeed's writer keys: type, decoupled, "
                         "io_buffer_size, io_buffer_double, show_statistics, data_parallel, "
                         "io_multiplier)");
      continue;
    }
    const std::string low = v.is_string() ? lower(v.get<std::string>()) : "";
    if (key == "type" && !(low == "mock" || low == "python" || low == "fast"))
      fail(key, "one of \"mock\", \"python\", \"fast\"", v);
    if ((key == "decoupled" || key == "io_buffer_double" || key == "show_statistics") &&
        !v.is_boolean())
      fail(key, "true or false", v);
    if ((key == "io_buffer_size" || key == "io_multiplier") &&
        !(v.is_number() && v.get<double>() > 0))
      fail(key, "a positive number", v);
    if (key == "data_parallel" && !v.is_null() &&
        !(low == "replica" || low == "socket" || low == "machine"))
      fail(key, "null or one of \"replica\", \"socket\", \"machine\"", v);
  }
  std::string said =
      "checkpoint.writer: zerostream writes checkpoints with its own writer (staged O_DIRECT "
      "writes, each file fsynced, the tag committed by rename); DeepSpeed's writer settings "
      "have no effect";
  const auto type = w.find("type");
  if (type != w.end() && type->is_string() && lower(type->get<std::string>()) == "mock")
    said += "; type \"mock\" writes nothing in DeepSpeed, here the checkpoint is written";
  const auto decoupled = w.find("decoupled");
  if (decoupled != w.end() && *decoupled == true)
    said += "; decoupled: save_checkpoint returns once the files are written, not before";
  r.warnings.push_back(said);
}

}  // namespace

void check_cross_field_rules(Resolution& r) {
  const int64_t stage = integer(r, "zero_optimization.stage");
  precision_rules(r, stage);
  offload_rules(r, stage);
  zero_rules(r, stage);
  feature_rules(r, stage);
  max_grad_norm_rule(r);
  checkpoint_writer_rule(r);
}

}  // namespace zs::config
