// The batch rule (reference §1.3) and "auto" resolution.
#include "config_test_util.h"

namespace zs::config {
namespace {

using testing::check;

struct Triad {
  const char* body;
  int64_t world;
  int64_t train, micro, gas;  // expected; 0 = expect an error
  const char* error;
};

TEST(Batch, DerivationTableFromTheReference) {
  const Triad cases[] = {
      {R"("train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4)",
       2, 16, 2, 4, ""},
      {R"("train_batch_size": 16, "train_micro_batch_size_per_gpu": 2)", 2, 16, 2, 4, ""},
      {R"("train_batch_size": 16, "gradient_accumulation_steps": 4)", 2, 16, 2, 4, ""},
      {R"("train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4)", 2, 16, 2, 4, ""},
      {R"("train_batch_size": 16)", 2, 16, 8, 1, ""},
      {R"("train_micro_batch_size_per_gpu": 3)", 4, 12, 3, 1, ""},
      {R"("train_batch_size": 17, "train_micro_batch_size_per_gpu": 2)", 2, 0, 0, 0,
       "train_batch_size: 17 != train_micro_batch_size_per_gpu 2 * gradient_accumulation_steps 4 * "
       "data-parallel world size 2"},
      {R"("train_batch_size": 16, "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 2)",
       2, 0, 0, 0,
       "train_batch_size: 16 != train_micro_batch_size_per_gpu 3 * gradient_accumulation_steps 2 * "
       "data-parallel world size 2"},
      {R"("train_batch_size": 4, "train_micro_batch_size_per_gpu": 8)", 1, 0, 0, 0,
       "gradient_accumulation_steps: has to be greater than 0; got 0"},
      {R"("train_batch_size": 0)", 1, 0, 0, 0, "train_batch_size: must be > 0; got 0"},
      {R"("gradient_accumulation_steps": 4)", 1, 0, 0, 0,
       "either train_batch_size or train_micro_batch_size_per_gpu needs to be provided"},
      {R"("steps_per_print": 1)", 1, 0, 0, 0,
       "either train_batch_size or train_micro_batch_size_per_gpu needs to be provided"},
  };
  for (const Triad& t : cases) {
    RunContext ctx;
    ctx.world_size = t.world;
    ctx.require_batch = true;
    const Resolution r = check(std::string("{") + t.body + "}", ctx);
    SCOPED_TRACE(t.body);
    if (t.train == 0) {
      EXPECT_ERROR(r, t.error);
      continue;
    }
    EXPECT_OK(r);
    EXPECT_EQ(r.at("train_batch_size"), t.train);
    EXPECT_EQ(r.at("train_micro_batch_size_per_gpu"), t.micro);
    EXPECT_EQ(r.at("gradient_accumulation_steps"), t.gas);
  }
}

// Accelerate on a CPU machine with no backend counts one process and fills train_batch_size
// for it, while torchrun started two ranks (issue 31): the error says what was counted and
// gives the fix.
TEST(Batch, ABatchFilledForAnotherWorldSizeSaysSoAndGivesAccelerateFix) {
  RunContext ctx;
  ctx.world_size = 2;
  ctx.require_batch = true;
  const Resolution r = check(R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 8,
                                 "gradient_accumulation_steps": 1})",
                             ctx);
  EXPECT_ERROR(r, "train_batch_size: 8 != train_micro_batch_size_per_gpu 8");
  EXPECT_ERROR(r, "counted 1 process where the process group has 2 data-parallel ranks");
  EXPECT_ERROR(r, "InitProcessGroupKwargs(backend=\"gloo\")");
  EXPECT_ERROR(r, "PartialState(backend=\"gloo\")");
  // Filled for 4 ranks, run on 2: the count, without Accelerate's one-process fix.
  const Resolution four = check(R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2,
                                    "gradient_accumulation_steps": 2})",
                                ctx);
  EXPECT_ERROR(four, "counted 4 processes where the process group has 2 data-parallel ranks");
  for (const auto& e : four.errors) EXPECT_EQ(e.find("InitProcessGroupKwargs"), std::string::npos);
}

TEST(Batch, ZeroAndNegativeSizesAreRejected) {
  RunContext ctx;
  ctx.require_batch = true;
  EXPECT_ERROR(check(R"({"train_micro_batch_size_per_gpu": 0})", ctx),
               "train_micro_batch_size_per_gpu: must be > 0; got 0");
}

TEST(Batch, MissingBatchIsAWarningForConfigCheck) {
  const Resolution r = check(R"({"zero_optimization": {"stage": 2}})");
  EXPECT_OK(r);
  EXPECT_WARNING(r,
                 "either train_batch_size or train_micro_batch_size_per_gpu needs to be provided");
}

TEST(Batch, SequenceParallelDividesTheWorld) {
  RunContext ctx;
  ctx.world_size = 4;
  const Resolution r = check(
      R"({"train_micro_batch_size_per_gpu": 1, "sequence_parallel_size": 2})", ctx);
  EXPECT_OK(r);
  EXPECT_EQ(r.at("train_batch_size"), 2);
  ctx.world_size = 3;
  EXPECT_ERROR(check(R"({"train_micro_batch_size_per_gpu": 1, "sequence_parallel_size": 2})", ctx),
               "sequence_parallel_size: 2 does not divide the world size 3");
}

TEST(Auto, BatchKeysComeFromTheRun) {
  RunContext ctx;
  ctx.world_size = 2;
  ctx.micro_batch_size = 4;
  ctx.gradient_accumulation_steps = 2;
  const Resolution r = check(
      R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
                                  "gradient_accumulation_steps": "auto"})",
      ctx);
  EXPECT_OK(r);
  EXPECT_EQ(r.at("train_batch_size"), 16);
  EXPECT_EQ(r.origins.at("train_micro_batch_size_per_gpu"), Origin::kAuto);
  const Resolution nothing = check(
      R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto"})");
  EXPECT_OK(nothing);
  EXPECT_EQ(nothing.at("train_micro_batch_size_per_gpu"), 1);
  EXPECT_TRUE(testing::has_message(nothing.notes,
                                   "train_micro_batch_size_per_gpu: \"auto\" with no batch size"));
}

TEST(Auto, BucketSizesFromTheHiddenSize) {
  RunContext ctx;
  ctx.hidden_size = 1024;
  const Resolution r = check(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
      "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
      "stage3_param_persistence_threshold": "auto"}})",
                             ctx);
  EXPECT_OK(r);
  EXPECT_EQ(r.at("zero_optimization.reduce_bucket_size"), 1024 * 1024);
  EXPECT_EQ(r.at("zero_optimization.stage3_prefetch_bucket_size"), 943718);  // 0.9 * h^2
  EXPECT_EQ(r.at("zero_optimization.stage3_param_persistence_threshold"), 10240);
  EXPECT_EQ(r.origins.at("zero_optimization.reduce_bucket_size"), Origin::kAuto);
  const Resolution fallback = check(
      R"({"train_batch_size": 8, "zero_optimization": {"reduce_bucket_size": "auto"}})");
  EXPECT_EQ(fallback.at("zero_optimization.reduce_bucket_size"), 500000000);
  EXPECT_TRUE(testing::has_message(
      fallback.notes,
      "zero_optimization.reduce_bucket_size: \"auto\" -> 500000000 (DeepSpeed's default"));
}

TEST(Auto, PrecisionOptimizerAndSchedulerFromTheRun) {
  RunContext ctx;
  ctx.model_dtype = "bf16";
  ctx.lr = 3e-4;
  ctx.total_num_steps = 500;
  const Resolution r = check(
      R"({"train_batch_size": 8, "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
      "gradient_clipping": "auto",
      "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "weight_decay": "auto"}},
      "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_max_lr": "auto", "total_num_steps": "auto"}}})",
      ctx);
  EXPECT_OK(r);
  EXPECT_EQ(r.at("bf16.enabled"), true);
  EXPECT_EQ(r.at("fp16.enabled"), false);
  EXPECT_EQ(r.at("gradient_clipping"), 1.0);
  EXPECT_EQ(r.at("optimizer.params.lr"), 3e-4);
  EXPECT_EQ(r.at("optimizer.params.betas"), Json::array({0.9, 0.999}));
  EXPECT_EQ(r.at("scheduler.params.warmup_max_lr"), 3e-4);
  EXPECT_EQ(r.at("scheduler.params.total_num_steps"), 500);
  EXPECT_EQ(r.at("communication_data_type"), "bf16");
}

TEST(Auto, RequiredValueWithoutTheRunIsAWarning) {
  const Resolution r = check(
      R"({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {}},
      "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto"}}})");
  EXPECT_OK(r);
  EXPECT_WARNING(r,
                 "scheduler.params.total_num_steps: \"auto\" cannot be resolved without the run");
}

}  // namespace
}  // namespace zs::config
