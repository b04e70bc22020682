// The typed config tree. Built once from a valid Resolution; components take their own
// sub-struct (STYLE.md item 8), never the raw dict.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "config/resolve.h"

namespace zs::config {

enum class OffloadDevice { kNone, kCpu, kNvme };

struct OffloadOptimizerConfig {
  OffloadDevice device = OffloadDevice::kNone;
  std::string nvme_path;  // empty unless device is nvme
  int64_t buffer_count = 4;
  bool pin_memory = true;
  bool pipeline_read = false;
  bool pipeline_write = false;
  bool fast_init = false;
  double ratio = 1.0;
};

struct OffloadParamConfig {
  OffloadDevice device = OffloadDevice::kNone;
  std::string nvme_path;
  int64_t buffer_count = 5;
  int64_t buffer_size = 100000000;  // elements
  int64_t max_in_cpu = 1000000000;  // elements
  bool pin_memory = true;
};

struct ZeroConfig {
  int stage = 0;
  bool contiguous_gradients = true;
  bool overlap_comm = false;  // resolved: true for stage 3 unless set
  bool reduce_scatter = true;
  int64_t reduce_bucket_size = 500000000;
  bool allgather_partitions = true;
  int64_t allgather_bucket_size = 500000000;
  bool round_robin_gradients = false;
  bool load_from_fp32_weights = true;
  bool elastic_checkpoint = false;
  int64_t sub_group_size = 1000000000;
  int64_t prefetch_bucket_size = 50000000;
  int64_t param_persistence_threshold = 100000;
  int64_t model_persistence_threshold = INT64_MAX;
  int64_t max_live_parameters = 1000000000;
  int64_t max_reuse_distance = 1000000000;
  bool gather_16bit_weights_on_model_save = false;
  bool allgather_sequential = false;
  bool ignore_unused_parameters = true;
  OffloadOptimizerConfig offload_optimizer;
  OffloadParamConfig offload_param;  // stage 3 only
};

struct Fp16Config {
  bool enabled = false;
  bool auto_cast = false;
  double loss_scale = 0.0;  // 0: dynamic
  int initial_scale_power = 16;
  int loss_scale_window = 1000;
  int hysteresis = 2;
  bool consecutive_hysteresis = false;
  int min_loss_scale = 1;
};

struct Bf16Config {
  bool enabled = false;
  bool immediate_grad_update = false;
  bool check_grad_overflow = true;
};

enum class IoBackend { kAuto, kIoUring, kThreads };

struct AioConfig {
  int64_t block_size = 1048576;
  int64_t queue_depth = 8;
  int64_t intra_op_parallelism = 1;
  bool single_submit = false;
  bool overlap_events = true;
  IoBackend backend = IoBackend::kAuto;  // zerostream extension key aio.backend
  bool verify_checksums = false;         // zerostream extension key zerostream.verify_swap_checksums
};

struct BatchConfig {
  int64_t train_batch_size = 0;
  int64_t micro_batch_size = 0;
  int64_t gradient_accumulation_steps = 0;
  int64_t data_parallel_size = 1;
};

struct DsConfig {
  BatchConfig batch;
  double gradient_clipping = 1.0;
  std::optional<int64_t> steps_per_print;
  bool wall_clock_breakdown = false;
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
  std::string communication_data_type = "fp32";
  bool zero_allow_untested_optimizer = false;
  bool zero_force_ds_cpu_optimizer = true;
  ZeroConfig zero;
  Fp16Config fp16;
  Bf16Config bf16;
  AioConfig aio;
  Json optimizer;  // {"type", "params"} or null
  Json scheduler;  // {"type", "params"} or null
  Resolution resolution;  // the resolved tree with origins, warnings and notes
};

// Builds the typed tree; `r` must be ok().
DsConfig typed_config(Resolution r, int64_t data_parallel_size);

// Reads, validates and resolves config text. Throws zs::ValueError listing every error,
// one per line, each starting with its key path.
DsConfig load_config(std::string_view text, const std::string& source, const RunContext& ctx);

// Same, without throwing: the resolution carries the errors (for `zerostream config check`).
Resolution check_config(std::string_view text, const std::string& source,
                        const RunContext& ctx);

}  // namespace zs::config
