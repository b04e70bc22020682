#include "config/ds_config.h"

#include "common/check.h"

namespace zs::config {
namespace {

class Reader {
 public:
  explicit Reader(const Resolution& r) : r_(r) {}
  bool b(const std::string& p) const { return r_.at(p) == true; }
  int64_t i(const std::string& p) const { return r_.at(p).get<int64_t>(); }
  double f(const std::string& p) const { return r_.at(p).get<double>(); }
  std::string s(const std::string& p) const {
    const Json& v = r_.at(p);
    return v.is_string() ? v.get<std::string>() : "";
  }

 private:
  const Resolution& r_;
};

OffloadDevice device(const std::string& d) {
  if (d == "cpu") return OffloadDevice::kCpu;
  if (d == "nvme") return OffloadDevice::kNvme;
  return OffloadDevice::kNone;
}

ZeroConfig zero_config(const Reader& g, const Resolution& r) {
  const std::string z = "zero_optimization.";
  ZeroConfig c;
  c.stage = static_cast<int>(g.i(z + "stage"));
  c.contiguous_gradients = g.b(z + "contiguous_gradients");
  c.overlap_comm = g.b(z + "overlap_comm");
  c.reduce_scatter = g.b(z + "reduce_scatter");
  c.reduce_bucket_size = g.i(z + "reduce_bucket_size");
  c.allgather_partitions = g.b(z + "allgather_partitions");
  c.allgather_bucket_size = g.i(z + "allgather_bucket_size");
  c.round_robin_gradients = g.b(z + "round_robin_gradients");
  c.load_from_fp32_weights = g.b(z + "load_from_fp32_weights");
  c.elastic_checkpoint = g.b(z + "elastic_checkpoint");
  c.sub_group_size = g.i(z + "sub_group_size");
  c.prefetch_bucket_size = g.i(z + "stage3_prefetch_bucket_size");
  c.param_persistence_threshold = g.i(z + "stage3_param_persistence_threshold");
  c.model_persistence_threshold = g.i(z + "stage3_model_persistence_threshold");
  c.max_live_parameters = g.i(z + "stage3_max_live_parameters");
  c.max_reuse_distance = g.i(z + "stage3_max_reuse_distance");
  c.gather_16bit_weights_on_model_save = g.b(z + "stage3_gather_16bit_weights_on_model_save");
  c.allgather_sequential = g.b(z + "stage3_allgather_sequential");
  c.ignore_unused_parameters = g.b(z + "ignore_unused_parameters");
  if (r.at(z + "offload_optimizer").is_object()) {
    const std::string o = z + "offload_optimizer.";
    OffloadOptimizerConfig& oo = c.offload_optimizer;
    oo.device = device(g.s(o + "device"));
    oo.nvme_path = g.s(o + "nvme_path");
    oo.buffer_count = g.i(o + "buffer_count");
    oo.pin_memory = g.b(o + "pin_memory");
    oo.pipeline_read = g.b(o + "pipeline_read");
    oo.pipeline_write = g.b(o + "pipeline_write");
    oo.fast_init = g.b(o + "fast_init");
    oo.ratio = g.f(o + "ratio");
  }
  if (r.at(z + "offload_param").is_object()) {
    const std::string o = z + "offload_param.";
    OffloadParamConfig& op = c.offload_param;
    op.device = device(g.s(o + "device"));
    op.nvme_path = g.s(o + "nvme_path");
    op.buffer_count = g.i(o + "buffer_count");
    op.buffer_size = g.i(o + "buffer_size");
    op.max_in_cpu = g.i(o + "max_in_cpu");
    op.pin_memory = g.b(o + "pin_memory");
  }
  return c;
}

AioConfig aio_config(const Reader& g) {
  AioConfig a;
  a.block_size = g.i("aio.block_size");
  a.queue_depth = g.i("aio.queue_depth");
  a.intra_op_parallelism = g.i("aio.intra_op_parallelism");
  a.single_submit = g.b("aio.single_submit");
  a.overlap_events = g.b("aio.overlap_events");
  const std::string backend = g.s("aio.backend");
  a.backend = backend == "io_uring"  ? IoBackend::kIoUring
              : backend == "threads" ? IoBackend::kThreads
                                     : IoBackend::kAuto;
  a.verify_checksums = g.b("zerostream.verify_swap_checksums");
  return a;
}

}  // namespace

DsConfig typed_config(Resolution r, int64_t data_parallel_size) {
  ZS_CHECK(r.ok(), "typed_config needs a valid resolution");
  const Reader g(r);
  DsConfig c;
  const auto count = [&](const char* key) {
    return r.at(key).is_number_integer() ? g.i(key) : 0;  // 0: left to the run
  };
  c.batch = {count("train_batch_size"), count("train_micro_batch_size_per_gpu"),
             count("gradient_accumulation_steps"), data_parallel_size};
  c.gradient_clipping = g.f("gradient_clipping");
  if (r.at("steps_per_print").is_number()) c.steps_per_print = g.i("steps_per_print");
  c.wall_clock_breakdown = g.b("wall_clock_breakdown");
  c.prescale_gradients = g.b("prescale_gradients");
  c.gradient_predivide_factor = g.f("gradient_predivide_factor");
  c.communication_data_type = g.s("communication_data_type");
  c.zero_allow_untested_optimizer = g.b("zero_allow_untested_optimizer");
  c.zero_force_ds_cpu_optimizer = g.b("zero_force_ds_cpu_optimizer");
  c.zero = zero_config(g, r);
  c.fp16 = {g.b("fp16.enabled"), g.b("fp16.auto_cast"), g.f("fp16.loss_scale"),
            static_cast<int>(g.i("fp16.initial_scale_power")),
            static_cast<int>(g.i("fp16.loss_scale_window")),
            static_cast<int>(g.i("fp16.hysteresis")), g.b("fp16.consecutive_hysteresis"),
            static_cast<int>(g.i("fp16.min_loss_scale"))};
  c.bf16 = {g.b("bf16.enabled"), g.b("bf16.immediate_grad_update"),
            g.b("bf16.check_grad_overflow")};
  c.aio = aio_config(g);
  c.optimizer = r.at("optimizer");
  c.scheduler = r.at("scheduler");
  c.resolution = std::move(r);
  return c;
}

Resolution check_config(std::string_view text, const std::string& source,
                        const RunContext& ctx) {
  Json input;
  try {
    input = read_json_text(text, source);
  } catch (const ValueError& e) {
    Resolution r;
    r.errors.push_back(e.what());
    return r;
  }
  return resolve(input, ctx);
}

DsConfig load_config(std::string_view text, const std::string& source, const RunContext& ctx) {
  Resolution r = check_config(text, source, ctx);
  if (!r.ok()) {
    std::string msg = "invalid DeepSpeed config " + source + ":";
    for (const std::string& e : r.errors) msg += "\n  " + e;
    throw ValueError(msg);
  }
  const int64_t sp = r.at("sequence_parallel_size").get<int64_t>();
  return typed_config(std::move(r), ctx.world_size.value_or(sp) / sp);
}

}  // namespace zs::config
