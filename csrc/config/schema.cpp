#include "config/schema.h"
#include "config/text_util.h"

#include <algorithm>
#include <cctype>
#include <climits>

namespace zs::config {
namespace {

Key make(const char* name, Kind kind, Json def) {
  Key k;
  k.name = name;
  k.kind = kind;
  k.default_value = std::move(def);
  if (k.default_value.is_null()) k.nullable = true;
  return k;
}
Key B(const char* n, Json d) { return make(n, Kind::kBool, std::move(d)); }
Key I(const char* n, Json d) { return make(n, Kind::kInt, std::move(d)); }
Key U(const char* n, Json d) { return make(n, Kind::kInt, std::move(d)).at_least(0); }
Key F(const char* n, Json d) { return make(n, Kind::kFloat, std::move(d)); }
Key S(const char* n, Json d) { return make(n, Kind::kString, std::move(d)); }
Key A(const char* n, Json d = nullptr) { return make(n, Kind::kAny, std::move(d)); }
Key E(const char* n, Json d, std::vector<Json> choices, bool ci = false) {
  Key k = make(n, Kind::kEnum, std::move(d));
  k.choices = std::move(choices);
  k.case_insensitive = ci;
  return k;
}
Key Sec(const char* n, const Section* s) {
  Key k = make(n, Kind::kSection, Json::object());
  k.nullable = false;
  k.section = s;
  return k;
}

const std::vector<Json> kDtypes = {"fp32",          "fp16",          "bf16",          "float32",
                                   "float16",       "bfloat16",      "float",         "half",
                                   "torch.float32", "torch.float16", "torch.bfloat16"};
const Json kMaxSize = static_cast<int64_t>(LLONG_MAX);

struct Schema {
  Section root, zero, offload_optimizer, offload_param, fp16, bf16, optimizer, scheduler, aio,
      activation_checkpointing, data_types, checkpoint, parallel_write, tensorboard, csv_monitor,
      wandb, comet, flops_profiler, comms_logger, torch_autocast, zerostream, timers,
      timers_throughput;
  Section opt_adam, opt_adagrad, opt_lion, opt_sgd;
  Section sch_warmup, sch_warmup_decay, sch_warmup_cosine, sch_one_cycle, sch_range_test;

  // The key tables are laid out by hand, one key per line, as the schema reads best.
  // clang-format off
  Schema() {
    offload_optimizer = {"zero_optimization.offload_optimizer", true, true, {
        E("device", "none", {"none", "cpu", "nvme"}),
        S("nvme_path", nullptr),
        U("buffer_count", 4),
        B("pin_memory", true),
        B("pipeline_read", false),
        B("pipeline_write", false),
        B("pipeline", false),
        B("fast_init", false),
        F("ratio", 1.0).at_least(0).at_most(1),
        B("super_offload", false),
        F("cpuadam_cores_perc", 0.8).at_least(0).at_most(1),
    }};
    offload_param = {"zero_optimization.offload_param", true, true, {
        E("device", "none", {"none", "cpu", "nvme"}),
        S("nvme_path", nullptr),
        U("buffer_count", 5),
        U("buffer_size", 100000000),
        U("max_in_cpu", 1000000000).or_auto(),  // "auto": zerostream plans it (offload/tiers.py)
        B("pin_memory", true),
    }};
    zero = {"zero_optimization", true, true, {
        I("stage", 0).one_of({0, 1, 2, 3}),
        B("contiguous_gradients", true),
        B("overlap_comm", nullptr),
        B("reduce_scatter", true),
        U("reduce_bucket_size", 500000000),
        B("use_multi_rank_bucket_allreduce", true),
        B("allgather_partitions", true),
        U("allgather_bucket_size", 500000000),
        B("round_robin_gradients", false),
        B("load_from_fp32_weights", true),
        B("elastic_checkpoint", false),
        B("parameter_alignment", false),
        Sec("offload_optimizer", &offload_optimizer).allow_null().lazy(),
        Sec("offload_param", &offload_param).allow_null().lazy(),
        U("sub_group_size", 1000000000),
        U("stage3_prefetch_bucket_size", 50000000).alias("prefetch_bucket_size"),
        U("stage3_param_persistence_threshold", 100000).alias("param_persistence_threshold"),
        U("stage3_model_persistence_threshold", kMaxSize).alias("model_persistence_threshold"),
        U("stage3_max_live_parameters", 1000000000).alias("max_live_parameters"),
        U("stage3_max_reuse_distance", 1000000000).alias("max_reuse_distance"),
        B("stage3_gather_16bit_weights_on_model_save", false)
            .alias("gather_16bit_weights_on_model_save"),
        I("stage3_module_granularity_threshold", 0),
        B("stage3_use_all_reduce_for_fetch_params", false)
            .alias("use_all_reduce_for_fetch_params"),
        B("stage3_allgather_sequential", false).alias("allgather_sequential"),
        B("ignore_unused_parameters", true),
        B("legacy_stage1", false),
        U("zero_hpz_partition_size", 1),
        B("zero_quantized_weights", false),
        B("zero_quantized_nontrainable_weights", false),
        B("zero_quantized_gradients", false),
        A("zeropp_loco_param"),
        I("mics_shard_size", -1),
        B("mics_hierarchical_params_gather", false),
        B("memory_efficient_linear", true),
        B("pipeline_loading_checkpoint", false),
        B("override_module_apply", true),
        B("log_trace_cache_warnings", false),
        B("enable_sanity_checks", false),
        B("save_muon_momentum_buffer_in_memory", false),
        A("zenflow"),
        A("leaf_module", Json::object()),
        B("cpu_offload", nullptr).deprecated(Deprecation::kCpuOffload, "offload_optimizer",
                                             "use \"offload_optimizer\": {\"device\": \"cpu\"}"),
        B("cpu_offload_param", nullptr)
            .deprecated(Deprecation::kCpuOffloadParam, "offload_param",
                        "use \"offload_param\": {\"device\": \"cpu\"}"),
        B("cpu_offload_use_pin_memory", nullptr)
            .deprecated(Deprecation::kWarnOnly, "",
                        "use offload_optimizer.pin_memory / offload_param.pin_memory"),
        B("stage3_gather_fp16_weights_on_model_save", nullptr)
            .deprecated(Deprecation::kRename, "stage3_gather_16bit_weights_on_model_save",
                        "renamed stage3_gather_16bit_weights_on_model_save"),
    }};
    fp16 = {"fp16", true, true, {
        B("enabled", false),
        B("auto_cast", false),
        F("loss_scale", 0.0).at_least(0),
        I("initial_scale_power", 16),
        I("loss_scale_window", 1000),
        I("hysteresis", 2),
        B("consecutive_hysteresis", false),
        I("min_loss_scale", 1),
        B("fp16_master_weights_and_grads", false),
    }};
    bf16 = {"bf16", true, true, {
        B("enabled", false),
        B("immediate_grad_update", false),
        B("check_grad_overflow", true),
        B("bf16_master_weights_and_grads", false),
        B("bf16_optimizer_states", false),
    }};
    opt_adam = {"optimizer.params", true, true, {
        F("lr", 1e-3).at_least(0), A("betas", Json::array({0.9, 0.999})),
        F("eps", 1e-8).at_least(0), F("weight_decay", 0.0).at_least(0),
        B("bias_correction", true), B("amsgrad", false), B("adam_w_mode", true),
        B("torch_adam", false), B("fp32_optimizer_states", true), B("set_grad_none", true),
    }};
    opt_adagrad = {"optimizer.params", true, true, {
        F("lr", 1e-2).at_least(0), F("eps", 1e-10).at_least(0),
        F("weight_decay", 0.0).at_least(0), F("lr_decay", 0.0).at_least(0),
        F("initial_accumulator_value", 0.0).at_least(0), B("amsgrad", false),
        B("fp32_optimizer_states", true),
    }};
    opt_lion = {"optimizer.params", true, true, {
        F("lr", 1e-3).at_least(0), A("betas", Json::array({0.9, 0.999})),
        F("weight_decay", 0.0).at_least(0), B("fp32_optimizer_states", true),
    }};
    opt_sgd = {"optimizer.params", true, true, {
        F("lr", 1e-3).at_least(0), F("momentum", 0.0).at_least(0),
        F("dampening", 0.0), F("weight_decay", 0.0).at_least(0), B("nesterov", false),
        B("maximize", false), B("foreach", nullptr), B("differentiable", false),
        B("fused", nullptr),
    }};
    optimizer = {"optimizer", false, true, {
        S("type", nullptr), A("params", Json::object()), B("legacy_fusion", false),
    }};
    const auto warmup_keys = [] {
      return std::vector<Key>{
          A("warmup_min_lr", 0.0), A("warmup_max_lr", 0.001), I("warmup_num_steps", 1000).at_least(0),
          E("warmup_type", "log", {"log", "linear"}), I("last_batch_iteration", -1)};
    };
    sch_warmup = {"scheduler.params", true, true, warmup_keys()};
    sch_warmup.keys[1].default_value = nullptr;  // WarmupLR: None = the optimizer's lr
    sch_warmup.keys[1].nullable = true;
    sch_warmup_decay = {"scheduler.params", true, true, warmup_keys()};
    sch_warmup_decay.keys.push_back(I("total_num_steps", nullptr).greater_than_zero().must_be_given());
    sch_warmup_cosine = {"scheduler.params", true, true, {
        I("total_num_steps", nullptr).greater_than_zero().must_be_given(), F("warmup_min_ratio", 0.0),
        I("warmup_num_steps", 1000).at_least(0), F("cos_min_ratio", 0.0001),
        E("warmup_type", "log", {"log", "linear"}), I("last_batch_iteration", -1)}};
    sch_one_cycle = {"scheduler.params", true, true, {
        A("cycle_min_lr").must_be_given(), A("cycle_max_lr").must_be_given(), F("decay_lr_rate", 0.0),
        I("cycle_first_step_size", 2000).greater_than_zero(), I("cycle_second_step_size", nullptr),
        I("cycle_first_stair_count", 0), I("cycle_second_stair_count", nullptr),
        I("decay_step_size", 0), B("cycle_momentum", true), F("cycle_min_mom", 0.8),
        F("cycle_max_mom", 0.9), F("decay_mom_rate", 0.0), I("last_batch_iteration", -1)}};
    sch_range_test = {"scheduler.params", true, true, {
        A("lr_range_test_min_lr", 1e-3), I("lr_range_test_step_size", 2000).greater_than_zero(),
        F("lr_range_test_step_rate", 1.0), B("lr_range_test_staircase", false),
        I("last_batch_iteration", -1)}};
    scheduler = {"scheduler", false, true, {S("type", nullptr), A("params", nullptr)}};
    aio = {"aio", false, true, {
        I("block_size", 1048576).greater_than_zero(),
        I("queue_depth", 8).greater_than_zero(),
        I("intra_op_parallelism", 1).greater_than_zero(),
        // Quiet: PyTorch Lightning's default config writes it on every run, and DeepSpeed
        // drops it without a word (issue 31).
        I("thread_count", nullptr)
            .deprecated(Deprecation::kQuietRename, "intra_op_parallelism",
                        "renamed intra_op_parallelism in DeepSpeed 0.16.4"),
        B("single_submit", false),
        B("overlap_events", true),
        B("use_gds", false),
        E("backend", "auto", {"auto", "io_uring", "threads"}),  // zerostream extension
    }};
    activation_checkpointing = {"activation_checkpointing", false, true, {
        B("partition_activations", false), B("cpu_checkpointing", false),
        B("contiguous_memory_optimization", false), I("number_checkpoints", nullptr),
        B("synchronize_checkpoint_boundary", false), B("profile", false),
    }};
    data_types = {"data_types", false, true, {
        E("grad_accum_dtype", nullptr, kDtypes), E("param_dtype", nullptr, kDtypes),
        E("buffer_dtype", nullptr, kDtypes),
    }};
    parallel_write = {"checkpoint.parallel_write", false, true, {B("pipeline_stage", false)}};
    // The engine's throughput line (profiling/throughput.py). DeepSpeed synchronizes the
    // device at each timed start and stop by default; zerostream does not unless asked
    // (a synchronize would stall an update overlapped with the forward).
    timers_throughput = {"timers.throughput", false, true, {
        B("enabled", true), B("synchronized", false)}};
    timers = {"timers", false, true, {Sec("throughput", &timers_throughput)}};
    checkpoint = {"checkpoint", false, true, {
        E("tag_validation", "Warn", {"Ignore", "Warn", "Fail"}, true),
        B("load_universal", false), B("use_node_local_storage", false),
        Sec("parallel_write", &parallel_write), B("checkpoint_serialization", true),
        A("writer"),
    }};
    tensorboard = {"tensorboard", true, true, {
        B("enabled", false), S("output_path", ""), S("job_name", "DeepSpeedJobName")}};
    csv_monitor = {"csv_monitor", true, true, {
        B("enabled", false), S("output_path", ""), S("job_name", "DeepSpeedJobName")}};
    wandb = {"wandb", true, true, {
        B("enabled", false), S("group", nullptr), S("team", nullptr), S("project", "deepspeed")}};
    comet = {"comet", true, true, {
        B("enabled", false), I("samples_log_interval", 100), S("project", nullptr),
        S("workspace", nullptr), S("api_key", nullptr), S("experiment_name", nullptr),
        S("experiment_key", nullptr), B("online", nullptr), S("mode", nullptr)}};
    comms_logger = {"comms_logger", true, true, {
        B("enabled", false), B("prof_all", true), A("prof_ops", Json::array()),
        B("verbose", false), B("debug", false)}};
    flops_profiler = {"flops_profiler", false, true, {
        B("enabled", false), F("recompute_fwd_factor", 0.0).at_least(0),
        U("profile_step", 1),  // a global step number: the forward before it is profiled
        I("module_depth", -1).at_least(-1),  // -1: every depth
        U("top_modules", 1), B("detailed", true), S("output_file", nullptr)}};
    torch_autocast = {"torch_autocast", false, true, {
        B("enabled", false), S("dtype", nullptr), A("lower_precision_safe_modules")}};
    zerostream = {"zerostream", true, true, {B("verify_swap_checksums", true),
                                             U("cpu_optimizer_threads", 0),
                                             U("max_consecutive_skipped_steps", 50),
                                             E("offload_gradient_dtype", "auto", {"auto", "fp32"}),
                                             U("optimizer_max_in_cpu", 0).or_auto(),
                                             U("optimizer_max_on_device", 0).or_auto(),
                                             E("device_tier_grads", "device",
                                               {"device", "host"}),
                                             E("host_malloc", "system", {"system", "retain"}),
                                             E("overlap_step", "none",
                                               {"none", "next_forward", "backward"}),
                                             U("speculative_step_bytes", 1ull << 30)}};

    root = {"", false, true, {
        I("train_batch_size", nullptr).greater_than_zero(),
        I("train_micro_batch_size_per_gpu", nullptr).greater_than_zero(),
        I("gradient_accumulation_steps", nullptr).greater_than_zero(),
        F("gradient_clipping", 1.0).at_least(0),
        U("steps_per_print", nullptr),
        B("wall_clock_breakdown", false), B("memory_breakdown", false), B("dump_state", false),
        B("prescale_gradients", false), F("gradient_predivide_factor", 1.0).greater_than_zero(),
        E("gradient_allreduce_op", "mean", {"mean", "sum"}, true),
        E("communication_data_type", nullptr, {"fp16", "bf16", "fp32"}, true),
        B("zero_allow_untested_optimizer", false), B("zero_force_ds_cpu_optimizer", true),
        B("sparse_gradients", false), B("disable_allgather", false),
        B("dataloader_drop_last", false), B("managed_gradient_accumulation", true),
        I("vocabulary_size", nullptr), S("log_level", nullptr),
        I("sequence_parallel_size", 1).greater_than_zero(), U("allgather_size", 500000000),
        B("use_data_before_expert_parallelism", false), B("graph_harvesting", false),
        Sec("zero_optimization", &zero),
        Sec("fp16", &fp16),
        Sec("bf16", &bf16),
        A("bfloat16").deprecated(Deprecation::kRename, "bf16", "renamed bf16"),
        Sec("optimizer", &optimizer).allow_null().lazy(),
        Sec("scheduler", &scheduler).allow_null().lazy(),
        Sec("aio", &aio),
        Sec("activation_checkpointing", &activation_checkpointing),
        Sec("data_types", &data_types),
        Sec("checkpoint", &checkpoint),
        Sec("tensorboard", &tensorboard), Sec("csv_monitor", &csv_monitor),
        Sec("wandb", &wandb), Sec("comet", &comet),
        Sec("comms_logger", &comms_logger),
        Sec("timers", &timers),
        Sec("flops_profiler", &flops_profiler),
        Sec("torch_autocast", &torch_autocast).lazy(),
        Sec("zerostream", &zerostream),
        // Resolved by zerostream/elasticity.py before the batch rule; checked there.
        A("elasticity"),
        // DeepSpeed features zerostream accepts but does not implement (warned when used).
        A("amp"), A("autotuning"), A("pipeline"), A("sparse_attention"),
        A("eigenvalue"), A("progressive_layer_drop"), A("curriculum_learning"),
        A("data_efficiency"), A("compression_training"), A("quantize_training"),
        A("tensor_parallel"), A("nebula"), A("datastates"), A("hybrid_engine"), A("compile"),
        A("weight_quantization"),
    }};
  }
  // clang-format on
};

const Schema& schema() {
  static const Schema s;
  return s;
}

void collect_paths(const Section& s, const std::string& prefix, std::vector<std::string>& out) {
  for (const Key& k : s.keys) {
    const std::string path = prefix.empty() ? k.name : prefix + "." + k.name;
    out.push_back(path);
    for (const std::string& a : k.aliases) out.push_back(prefix.empty() ? a : prefix + "." + a);
    if (k.kind == Kind::kSection) collect_paths(*k.section, path, out);
  }
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

const Key* Section::find(const std::string& name) const {
  for (const Key& k : keys) {
    if (k.name == name) return &k;
    for (const std::string& a : k.aliases)
      if (a == name) return &k;
  }
  return nullptr;
}

std::vector<std::string> Section::key_names() const {
  std::vector<std::string> out;
  for (const Key& k : keys) out.push_back(k.name);
  return out;
}

const Section& root_schema() { return schema().root; }

const Section* optimizer_params_schema(const std::string& t) {
  const Schema& s = schema();
  if (t == "adam" || t == "adamw") return &s.opt_adam;
  if (t == "adagrad") return &s.opt_adagrad;
  if (t == "lion") return &s.opt_lion;
  if (t == "sgd") return &s.opt_sgd;
  return nullptr;
}

const Section* scheduler_params_schema(const std::string& t) {
  const Schema& s = schema();
  if (t == "WarmupLR") return &s.sch_warmup;
  if (t == "WarmupDecayLR") return &s.sch_warmup_decay;
  if (t == "WarmupCosineLR") return &s.sch_warmup_cosine;
  if (t == "OneCycle") return &s.sch_one_cycle;
  if (t == "LRRangeTest") return &s.sch_range_test;
  return nullptr;
}

const std::vector<std::string>& deepspeed_optimizer_names() {
  static const std::vector<std::string> names = {
      "Adagrad",    "Adam",   "AdamW",   "Lamb",  "OneBitAdam", "ZeroOneAdam",
      "OneBitLamb", "MuAdam", "MuAdamW", "MuSGD", "Lion",       "Muon"};
  return names;
}

bool zerostream_implements_optimizer(const std::string& t) {
  return t == "adam" || t == "adamw" || t == "adagrad" || t == "lion" || t == "muon";
}

const std::vector<std::string>& torch_optimizer_names() {
  static const std::vector<std::string> names = {
      "Adadelta", "Adafactor", "Adagrad", "Adam",    "AdamW", "SparseAdam", "Adamax", "ASGD",
      "LBFGS",    "NAdam",     "RAdam",   "RMSprop", "Rprop", "SGD",        "Muon"};
  return names;
}

const std::vector<std::string>& deepspeed_scheduler_names() {
  static const std::vector<std::string> names = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR",
                                                 "OneCycle", "LRRangeTest"};
  return names;
}

const std::vector<std::string>& torch_scheduler_names() {
  static const std::vector<std::string> names = {"LambdaLR",
                                                 "MultiplicativeLR",
                                                 "StepLR",
                                                 "MultiStepLR",
                                                 "ConstantLR",
                                                 "LinearLR",
                                                 "ExponentialLR",
                                                 "SequentialLR",
                                                 "CosineAnnealingLR",
                                                 "ChainedScheduler",
                                                 "ReduceLROnPlateau",
                                                 "CyclicLR",
                                                 "CosineAnnealingWarmRestarts",
                                                 "OneCycleLR",
                                                 "PolynomialLR"};
  return names;
}

std::vector<std::string> accepted_key_paths() {
  std::vector<std::string> out;
  collect_paths(root_schema(), "", out);
  return out;
}

std::string closest_match(const std::string& word, const std::vector<std::string>& candidates) {
  const std::string w = lower(word);
  // Close enough to be a typo: a few edits, relative to the word's length.
  const size_t limit = std::max<size_t>(2, w.size() / 4);
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const std::string& c : candidates) {
    // The distance is at least the difference in length: skipping those that cannot be within
    // `limit` keeps a megabyte key from costing seconds per candidate (the answer is the same).
    const size_t gap = w.size() > c.size() ? w.size() - c.size() : c.size() - w.size();
    if (gap > limit) continue;
    const size_t d = edit_distance(w, lower(c));
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best_d <= limit ? best : "";
}

}  // namespace zs::config
