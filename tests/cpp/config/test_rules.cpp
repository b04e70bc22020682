// Cross-field rules, optimizer and scheduler checks.
#include "common/check.h"
#include "config_test_util.h"

namespace zs::config {
namespace {

using testing::check;

std::string cfg(const std::string& body) { return R"({"train_batch_size": 8, )" + body + "}"; }

TEST(Rules, Fp16AndBf16CannotBothBeOn) {
  EXPECT_ERROR(
      check(cfg(R"("fp16": {"enabled": true}, "bf16": {"enabled": true})")),
      "fp16.enabled, bf16.enabled: bfloat16 and fp16 modes cannot be simultaneously enabled");
}

TEST(Rules, NvmeNeedsAPath) {
  EXPECT_ERROR(
      check(cfg(R"("zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}})")),
      "zero_optimization.offload_param.nvme_path: required when "
      "zero_optimization.offload_param.device is \"nvme\"");
  EXPECT_ERROR(
      check(cfg(R"("zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}})")),
      "zero_optimization.offload_optimizer.nvme_path: required");
  EXPECT_OK(check(cfg(R"("zero_optimization": {"stage": 3,
      "offload_param": {"device": "nvme", "nvme_path": "/tmp/x"}})")));
}

TEST(Rules, OffloadParamBelowStage3IsIgnoredWithAWarning) {
  const Resolution r = check(
      cfg(R"("zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}})"));
  EXPECT_OK(r);
  EXPECT_WARNING(r, "zero_optimization.offload_param: only ZeRO stage 3 partitions parameters");
}

TEST(Rules, PrescaleAndPredivideNeedReduceScatterOffAtStage2) {
  EXPECT_ERROR(
      check(cfg(R"("prescale_gradients": true, "zero_optimization": {"stage": 2})")),
      "prescale_gradients: must be false with zero_optimization.stage 2 and reduce_scatter true");
  EXPECT_OK(check(cfg(
      R"("prescale_gradients": true, "zero_optimization": {"stage": 2, "reduce_scatter": false})")));
  EXPECT_OK(check(cfg(R"("prescale_gradients": true, "zero_optimization": {"stage": 0})")));
  EXPECT_ERROR(check(cfg(R"("gradient_predivide_factor": 2.0, "zero_optimization": {"stage": 3})")),
               "gradient_predivide_factor: must be 1.0 with zero_optimization.stage 3");
}

TEST(Rules, PartialOffloadNeedsStage3) {
  EXPECT_ERROR(
      check(cfg(
          R"("zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}})")),
      "zero_optimization.offload_optimizer.ratio: partial offloading (0.5 < 1) is only "
      "supported for ZeRO stage 3; got stage 2");
  // At stage 3 the first 1 - ratio of the sub-groups are stepped on the device, with either
  // offload device (Note [The device tier] in python/zerostream/offload/device_tier.py).
  EXPECT_OK(check(cfg(
      R"("zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.3}})")));
  EXPECT_OK(check(cfg(
      R"("zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp", "ratio": 0}})")));
  EXPECT_OK(check(cfg(
      R"("zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 1}})")));
}

TEST(Rules, SumAllreduceNotWithStage3) {
  EXPECT_ERROR(check(cfg(R"("gradient_allreduce_op": "sum", "zero_optimization": {"stage": 3})")),
               "gradient_allreduce_op: \"sum\" is not supported with ZeRO stage 3");
  EXPECT_ERROR(check(cfg(R"("gradient_allreduce_op": "avg")")),
               "gradient_allreduce_op: expected one of \"mean\", \"sum\"; got \"avg\" "
               "(Invalid gradient_allreduce_op)");
  // DeepSpeed lowercases the value, and refuses "sum" with ZenFlow and with DeepCompile.
  EXPECT_OK(check(cfg(R"("gradient_allreduce_op": "SUM", "zero_optimization": {"stage": 2})")));
  EXPECT_ERROR(check(cfg(R"("gradient_allreduce_op": "sum", "zero_optimization": {"stage": 2,
                             "zenflow": {}})")),
               "gradient_allreduce_op: \"sum\" is not supported with ZenFlow");
  EXPECT_ERROR(check(cfg(R"("gradient_allreduce_op": "Sum", "zero_optimization": {"stage": 1},
                             "compile": {"deepcompile": true})")),
               "gradient_allreduce_op: \"sum\" is not supported with DeepCompile");
}

TEST(Rules, GradAccumDtypeAtStage0MustBeTheModels) {
  // A warning here; initialize() raises NotImplementedError, as DeepSpeed's does.
  EXPECT_WARNING(check(cfg(R"("bf16": {"enabled": true}, "zero_optimization": {"stage": 0},
                               "data_types": {"grad_accum_dtype": "fp32"})")),
                 "data_types.grad_accum_dtype: \"fp32\" with the model in bf16 needs ZeRO stage "
                 "1-3");
  EXPECT_OK(check(cfg(R"("bf16": {"enabled": true}, "zero_optimization": {"stage": 0},
                          "data_types": {"grad_accum_dtype": "bfloat16"})")));
  EXPECT_OK(check(cfg(R"("bf16": {"enabled": true}, "zero_optimization": {"stage": 1},
                          "data_types": {"grad_accum_dtype": "fp32"})")));
}

TEST(Rules, LeafModuleSectionIsCheckedByName) {
  EXPECT_OK(check(cfg(R"("zero_optimization": {"stage": 3, "leaf_module":
                          {"classes": ["MixtralSparseMoeBlock"], "names": "mlp"}})")));
  EXPECT_ERROR(check(cfg(R"("zero_optimization": {"stage": 3, "leaf_module": {"class": "X"}})")),
               "zero_optimization.leaf_module.class: unknown key");
  EXPECT_ERROR(check(cfg(R"("zero_optimization": {"stage": 3, "leaf_module": {"names": [1]}})")),
               "zero_optimization.leaf_module.names: expected a string or a list of strings");
  EXPECT_ERROR(check(cfg(R"("zero_optimization": {"stage": 3, "leaf_module": ["X"]})")),
               "zero_optimization.leaf_module: expected an object");
}

TEST(Rules, LogLevelIsALevelName) {
  EXPECT_OK(check(cfg(R"("log_level": "ERROR")")));
  EXPECT_OK(check(cfg(R"("log_level": "info")")));
  EXPECT_ERROR(check(cfg(R"("log_level": "loud")")),
               "log_level: expected one of debug, info, warning, error, critical");
}

TEST(Rules, ElasticCheckpointAtStage3IsDeprecated) {
  auto r = check(cfg(R"("zero_optimization": {"stage": 3, "elastic_checkpoint": true})"));
  EXPECT_OK(r);
  EXPECT_WARNING(r, "zero_optimization.elastic_checkpoint: elastic checkpointing is deprecated");
}

TEST(Rules, LegacyStage1AndOddAllgatherBucket) {
  EXPECT_ERROR(check(cfg(R"("zero_optimization": {"stage": 1, "legacy_stage1": true})")),
               "zero_optimization.legacy_stage1");
  EXPECT_ERROR(check(cfg(R"("zero_optimization": {"stage": 1, "allgather_bucket_size": 1001})")),
               "zero_optimization.allgather_bucket_size: must be a multiple of 2 at stage 1/2 "
               "(DeepSpeed: allgather_bucket_size must be a multiple of "
               "nccl_start_alignment_factor, 2)");
}

TEST(Rules, MasterWeightOptions) {
  EXPECT_ERROR(check(cfg(R"("fp16": {"enabled": true, "fp16_master_weights_and_grads": true})")),
               "fp16.fp16_master_weights_and_grads: needs ZeRO stage 1-3");
  EXPECT_ERROR(check(cfg(R"("bf16": {"enabled": true, "bf16_optimizer_states": true},
                             "zero_optimization": {"stage": 1})")),
               "bf16.bf16_optimizer_states: needs bf16.bf16_master_weights_and_grads");
  EXPECT_ERROR(check(cfg(R"("bf16": {"enabled": true, "bf16_master_weights_and_grads": true})")),
               "bf16.bf16_master_weights_and_grads: needs ZeRO stage 1-3");
  // Implemented without offload (bf16 weights, gradients and moments): DeepSpeed's
  // bf16_master_weight example config.
  EXPECT_OK(check(cfg(R"("bf16": {"enabled": true, "bf16_master_weights_and_grads": true,
                                   "bf16_optimizer_states": true},
                         "zero_optimization": {"stage": 3})")));
  // fp32 moments beside bf16 weights exist only in DeepSpeed's offloaded CPU Adam.
  EXPECT_ERROR(check(cfg(R"("bf16": {"enabled": true, "bf16_master_weights_and_grads": true},
                            "zero_optimization": {"stage": 2})")),
               "bf16.bf16_master_weights_and_grads: without an offloaded optimizer it needs "
               "bf16.bf16_optimizer_states true as well");
  // With an offloaded optimizer the CPU kernels step bf16 masters, with fp32 or bf16 moments.
  for (const char* device : {"cpu", "nvme"}) {
    for (const char* states : {"true", "false"}) {
      EXPECT_OK(
          check(cfg(std::string(R"("bf16": {"enabled": true, "bf16_master_weights_and_grads": true,
                                   "bf16_optimizer_states": )") +
                    states + R"(}, "zero_optimization": {"stage": 3,
                             "offload_optimizer": {"device": ")" +
                    device + R"(", "nvme_path": "/tmp"}})")));
    }
  }
  EXPECT_ERROR(check(cfg(R"("fp16": {"enabled": true, "fp16_master_weights_and_grads": true},
                            "zero_optimization": {"stage": 2,
                                                  "offload_optimizer": {"device": "cpu"}})")),
               "fp16.fp16_master_weights_and_grads: fp16 master weights in the offloaded CPU "
               "optimizer are not supported by zerostream yet");
}

TEST(Rules, DynamicLossScaleNeedsPositiveWindowAndFloor) {
  EXPECT_ERROR(check(cfg(R"("fp16": {"enabled": true, "loss_scale_window": 0})")),
               "fp16.loss_scale_window: must be > 0 with dynamic loss scaling");
  EXPECT_ERROR(check(cfg(R"("fp16": {"enabled": true, "min_loss_scale": 0})")),
               "fp16.min_loss_scale: must be > 0 with dynamic loss scaling");
  EXPECT_ERROR(check(cfg(R"("fp16": {"enabled": true, "hysteresis": 0})")),
               "fp16.hysteresis: must be > 0 with dynamic loss scaling");
  EXPECT_ERROR(check(cfg(R"("fp16": {"enabled": true, "initial_scale_power": 128})")),
               "fp16.initial_scale_power: must be in [-126, 127] with dynamic loss scaling");
  EXPECT_OK(check(cfg(R"("fp16": {"enabled": true, "initial_scale_power": 32})")));
  EXPECT_OK(check(cfg(R"("fp16": {"enabled": true, "loss_scale": 128, "min_loss_scale": 0,
                                  "hysteresis": 0, "initial_scale_power": 500})")));
}

TEST(Rules, ParamDtypeMustMatchPrecision) {
  EXPECT_ERROR(check(cfg(R"("bf16": {"enabled": true}, "data_types": {"param_dtype": "fp16"})")),
               "data_types.param_dtype: \"fp16\" does not match the enabled precision (bf16)");
  EXPECT_OK(check(cfg(R"("bf16": {"enabled": true}, "data_types": {"param_dtype": "bfloat16"})")));
}

TEST(Rules, AmpAndOneBitOptimizersAreNotCompatibleWithZero) {
  EXPECT_ERROR(check(cfg(R"("amp": {"enabled": true}, "zero_optimization": {"stage": 1})")),
               "amp.enabled: Apex AMP and ZeRO are not compatible");
  EXPECT_ERROR(check(cfg(R"("optimizer": {"type": "OneBitAdam", "params": {}},
                            "zero_optimization": {"stage": 2})")),
               "optimizer.type: \"OneBitAdam\" is not compatible with ZeRO");
}

// Json::value("enabled", false) threw nlohmann's type_error (a RuntimeError out of load) for
// a non-boolean "enabled" in a pass-through section. Found by tests/python/config/test_fuzz.py.
TEST(Rules, NonBooleanEnabledInPassThroughSectionsIsNoCrash) {
  for (const char* section : {"amp", "curriculum_learning", "elasticity"}) {
    for (const char* enabled : {R"("yes")", "1", "[]", "{}", "null"}) {
      SCOPED_TRACE(std::string(section) + ".enabled " + enabled);
      const Resolution r = testing::check(std::string(R"({"train_batch_size": 8, ")") + section +
                                          R"(": {"enabled": )" + enabled + "}}");
      EXPECT_OK(r);
    }
  }
  EXPECT_ERROR(testing::check(R"({"train_batch_size": 8, "zero_optimization": {"stage": 1},
                                  "amp": {"enabled": true}})"),
               "amp.enabled: Apex AMP and ZeRO are not compatible");
}

TEST(Optimizer, TypesAndParameters) {
  const Resolution adam = check(cfg(R"("optimizer": {"type": "Adam", "params": {"lr": 0.01}})"));
  EXPECT_OK(adam);
  EXPECT_EQ(adam.at("optimizer.params.lr"), 0.01);
  EXPECT_EQ(adam.at("optimizer.params.adam_w_mode"), true);  // Adam means AdamW by default
  EXPECT_EQ(adam.origins.at("optimizer.params.eps"), Origin::kDefault);
  EXPECT_ERROR(check(cfg(R"("optimizer": {"type": "AdamWW", "params": {}})")),
               "optimizer.type: expected a DeepSpeed optimizer");
  EXPECT_ERROR(check(cfg(R"("optimizer": {"type": "AdamWW", "params": {}})")),
               "did you mean \"AdamW\"?");
  EXPECT_ERROR(check(cfg(R"("optimizer": {"type": "AdamW", "params": {"learning_rate": 1}})")),
               "optimizer.params.learning_rate: unknown key");
  EXPECT_ERROR(check(cfg(R"("optimizer": {"params": {}})")), "optimizer.type: required");
  EXPECT_OK(check(cfg(R"("optimizer": {"type": "RMSprop", "params": {"alpha": 0.9}})")));
  const Resolution lamb = check(cfg(R"("optimizer": {"type": "Lamb", "params": {"lr": 1}})"));
  EXPECT_OK(lamb);
  EXPECT_WARNING(
      lamb, "optimizer.type: \"Lamb\" is a DeepSpeed optimizer that zerostream does not implement");
}

TEST(Optimizer, MaxGradNormMustAgreeWithGradientClipping) {
  const Resolution same = check(
      cfg(R"("optimizer": {"type": "Adam", "params": {"max_grad_norm": 1.0}})"));
  EXPECT_OK(same);
  EXPECT_WARNING(same, "optimizer.params.max_grad_norm: not an optimizer parameter; ignored");
  EXPECT_ERROR(check(cfg(R"("gradient_clipping": 0.5,
                            "optimizer": {"type": "Adam", "params": {"max_grad_norm": 1.0}})")),
               "optimizer.params.max_grad_norm: not an optimizer parameter, and 1.0 differs "
               "from gradient_clipping 0.5");
}

TEST(Scheduler, TypesRequiredParametersAndTorchSchedules) {
  EXPECT_OK(check(cfg(R"("scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}})")));
  EXPECT_ERROR(check(cfg(R"("scheduler": {"type": "WarmupDecayLR", "params": {}})")),
               "scheduler.params.total_num_steps: required by WarmupDecayLR");
  EXPECT_ERROR(check(cfg(R"("scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0}})")),
               "scheduler.params.cycle_max_lr: required by OneCycle");
  EXPECT_ERROR(check(cfg(R"("scheduler": {"type": "WarmupLR"})")),
               "scheduler.params: required, as an object (it may be {})");
  EXPECT_ERROR(check(cfg(R"("scheduler": {"type": "warmuplr", "params": {}})")),
               "did you mean \"WarmupLR\"?");
  EXPECT_ERROR(
      check(cfg(R"("scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cubic"}})")),
      "scheduler.params.warmup_type: expected one of \"log\", \"linear\"; got \"cubic\"");
  EXPECT_OK(check(cfg(R"("scheduler": {"type": "StepLR", "params": {"step_size": 10}})")));
}

TEST(Notes, NvmeAtStage2IsHonouredAndSaid) {
  const Resolution r = check(cfg(R"("zero_optimization": {"stage": 2,
      "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"}})"));
  EXPECT_OK(r);
  EXPECT_TRUE(testing::has_message(r.notes, "keeps optimizer states on NVMe"));
}

TEST(Load, ThrowsWithEveryErrorOnItsOwnLine) {
  try {
    load_config(
        R"({"train_batch_size": 8, "fp16": {"enabled": 3}, "zero_optimization": {"stage": 9}})",
        "bad.json", RunContext{});
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("invalid DeepSpeed config bad.json:\n  "), std::string::npos) << m;
    EXPECT_NE(m.find("\n  fp16.enabled: expected a boolean"), std::string::npos) << m;
    EXPECT_NE(m.find("\n  zero_optimization.stage: expected one of 0, 1, 2, 3; got 9"),
              std::string::npos)
        << m;
  }
}

TEST(Load, ResolvedTreeCarriesEveryValue) {
  RunContext ctx;
  ctx.world_size = 4;
  const Resolution r = load_config(
      R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3,
      "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme"},
      "offload_param": {"device": "cpu", "buffer_size": 1e6}}, "bf16": {"enabled": true}})",
      "ok.json", ctx);
  EXPECT_EQ(r.at("train_batch_size"), 24);
  EXPECT_EQ(r.data_parallel_size, 4);
  EXPECT_EQ(r.at("zero_optimization.stage"), 3);
  EXPECT_EQ(r.at("zero_optimization.overlap_comm"), true);
  EXPECT_EQ(r.at("zero_optimization.offload_optimizer.device"), "nvme");
  EXPECT_EQ(r.at("zero_optimization.offload_optimizer.nvme_path"), "/nvme");
  EXPECT_EQ(r.at("zero_optimization.offload_optimizer.buffer_count"), 4);  // schema default
  EXPECT_EQ(r.at("zero_optimization.offload_param.device"), "cpu");
  EXPECT_EQ(r.at("zero_optimization.offload_param.buffer_size"), 1000000);
  EXPECT_EQ(r.at("bf16.enabled"), true);
  EXPECT_EQ(r.at("communication_data_type"), "bf16");
}

TEST(Load, DataParallelSizeIsTheWorldOverSequenceParallel) {
  RunContext ctx;
  ctx.world_size = 8;
  const Resolution r = load_config(
      R"({"train_micro_batch_size_per_gpu": 1, "sequence_parallel_size": 2})", "sp.json", ctx);
  EXPECT_EQ(r.data_parallel_size, 4);
  EXPECT_EQ(r.at("train_batch_size"), 4);
}

}  // namespace
}  // namespace zs::config
