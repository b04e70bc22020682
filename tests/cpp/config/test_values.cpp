// Types, defaults, aliases, deprecated keys and unknown keys.
#include "config_test_util.h"

namespace zs::config {
namespace {

using testing::check;

constexpr const char* kBatch = R"("train_batch_size": 8)";

std::string with_batch(const std::string& body) {
  return "{" + std::string(kBatch) + (body.empty() ? "" : ", " + body) + "}";
}

TEST(Defaults, MatchDeepSpeed) {
  const Resolution r = check(with_batch(""));
  EXPECT_OK(r);
  EXPECT_EQ(r.at("gradient_clipping"), 1.0);  // 1.0 since DeepSpeed 0.19.3
  EXPECT_TRUE(r.at("steps_per_print").is_null());
  EXPECT_EQ(r.at("zero_optimization.stage"), 0);
  EXPECT_EQ(r.at("zero_optimization.contiguous_gradients"), true);
  EXPECT_EQ(r.at("zero_optimization.reduce_scatter"), true);
  EXPECT_EQ(r.at("zero_optimization.reduce_bucket_size"), 500000000);
  EXPECT_EQ(r.at("zero_optimization.allgather_bucket_size"), 500000000);
  EXPECT_EQ(r.at("zero_optimization.sub_group_size"), 1000000000);
  EXPECT_EQ(r.at("zero_optimization.stage3_prefetch_bucket_size"), 50000000);
  EXPECT_EQ(r.at("zero_optimization.stage3_param_persistence_threshold"), 100000);
  EXPECT_EQ(r.at("zero_optimization.overlap_comm"), false);
  EXPECT_EQ(r.origins.at("zero_optimization.overlap_comm"), Origin::kDerived);
  EXPECT_TRUE(r.at("zero_optimization.offload_optimizer").is_null());
  EXPECT_EQ(r.at("fp16.initial_scale_power"), 16);
  EXPECT_EQ(r.at("fp16.loss_scale_window"), 1000);
  EXPECT_EQ(r.at("fp16.hysteresis"), 2);
  EXPECT_EQ(r.at("bf16.check_grad_overflow"), true);  // true since 0.19.3
  EXPECT_EQ(r.at("aio.block_size"), 1048576);
  EXPECT_EQ(r.at("aio.queue_depth"), 8);
  EXPECT_EQ(r.at("aio.overlap_events"), true);
  EXPECT_EQ(r.at("zero_force_ds_cpu_optimizer"), true);
  EXPECT_EQ(r.at("checkpoint.tag_validation"), "Warn");
  EXPECT_EQ(r.at("communication_data_type"), "fp32");
  EXPECT_EQ(r.origins.at("gradient_clipping"), Origin::kDefault);
}

TEST(Defaults, OverlapCommIsOnForStage3AndOffloadSectionsFillTheirDefaults) {
  const Resolution r = check(with_batch(
      R"("zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"},
          "offload_optimizer": {"device": "cpu"}})"));
  EXPECT_OK(r);
  EXPECT_EQ(r.at("zero_optimization.overlap_comm"), true);
  EXPECT_EQ(r.at("zero_optimization.offload_param.pin_memory"), true);  // true since 0.19.5
  EXPECT_EQ(r.at("zero_optimization.offload_param.buffer_count"), 5);
  EXPECT_EQ(r.at("zero_optimization.offload_param.buffer_size"), 100000000);
  EXPECT_EQ(r.at("zero_optimization.offload_optimizer.buffer_count"), 4);
  EXPECT_EQ(r.origins.at("zero_optimization.offload_param.device"), Origin::kFile);
  EXPECT_EQ(r.origins.at("zero_optimization.offload_param.buffer_count"), Origin::kDefault);
}

TEST(Types, MessagesNameThePathTheValueAndTheChoices) {
  const Resolution r = check(with_batch(R"("zero_optimization": {"stage": 3,
      "offload_param": {"device": "gpu"}})"));
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_EQ(r.errors[0],
            "zero_optimization.offload_param.device: expected one of \"none\", "
            "\"cpu\", \"nvme\"; got \"gpu\"");
}

TEST(Types, StageMustBeZeroToThree) {
  EXPECT_ERROR(check(with_batch(R"("zero_optimization": {"stage": 4})")),
               "zero_optimization.stage: expected one of 0, 1, 2, 3; got 4");
}

TEST(Types, IntegersAcceptIntegralFloatsOnly) {
  const Resolution ok = check(with_batch(R"("zero_optimization": {"reduce_bucket_size": 5e8})"));
  EXPECT_OK(ok);
  EXPECT_TRUE(ok.at("zero_optimization.reduce_bucket_size").is_number_integer());
  EXPECT_EQ(ok.at("zero_optimization.reduce_bucket_size"), 500000000);
  EXPECT_ERROR(check(with_batch(R"("fp16": {"min_loss_scale": 0.5})")),
               "fp16.min_loss_scale: expected an integer; got 0.5");
  EXPECT_ERROR(check(with_batch(R"("zero_optimization": {"sub_group_size": -1})")),
               "zero_optimization.sub_group_size: must be >= 0; got -1");
  EXPECT_ERROR(check(with_batch(R"("zero_optimization": {"sub_group_size": "big"})")),
               "zero_optimization.sub_group_size: expected an integer; got \"big\"");
}

TEST(Types, BooleansAcceptPydanticSpellings) {
  const Resolution r = check(with_batch(R"("fp16": {"enabled": "true"}, "bf16": {"enabled": 0})"));
  EXPECT_OK(r);
  EXPECT_EQ(r.at("fp16.enabled"), true);
  EXPECT_EQ(r.at("bf16.enabled"), false);
  EXPECT_ERROR(check(with_batch(R"("fp16": {"enabled": "maybe"})")),
               "fp16.enabled: expected a boolean (true or false); got \"maybe\"");
}

TEST(Types, RangesAndCaseInsensitiveEnums) {
  EXPECT_ERROR(check(with_batch(R"("zero_optimization": {"stage": 3,
                                  "offload_optimizer": {"device": "cpu", "ratio": 1.5}})")),
               "zero_optimization.offload_optimizer.ratio: must be >= 0 and <= 1; got 1.5");
  const Resolution r = check(with_batch(R"("communication_data_type": "BF16",
                                           "checkpoint": {"tag_validation": "fail"})"));
  EXPECT_OK(r);
  EXPECT_EQ(r.at("communication_data_type"), "bf16");
  EXPECT_EQ(r.at("checkpoint.tag_validation"), "Fail");
  EXPECT_ERROR(check(with_batch(R"("checkpoint": {"tag_validation": "Sometimes"})")),
               "checkpoint.tag_validation: expected one of \"Ignore\", \"Warn\", \"Fail\"");
}

TEST(Aliases, ShortFieldNamesAreAcceptedButNotBothSpellings) {
  const Resolution r = check(with_batch(
      R"("zero_optimization": {"stage": 3, "prefetch_bucket_size": 123, "max_live_parameters": 7})"));
  EXPECT_OK(r);
  EXPECT_EQ(r.at("zero_optimization.stage3_prefetch_bucket_size"), 123);
  EXPECT_EQ(r.at("zero_optimization.stage3_max_live_parameters"), 7);
  EXPECT_ERROR(check(with_batch(R"("zero_optimization": {"prefetch_bucket_size": 1,
                                   "stage3_prefetch_bucket_size": 2})")),
               "sets the same thing (zero_optimization.stage3_prefetch_bucket_size)");
}

TEST(Deprecated, RenamedKeysMoveTheirValueWithAWarning) {
  const Resolution r = check(with_batch(
      R"("zero_optimization": {"stage": 3, "stage3_gather_fp16_weights_on_model_save": true},
         "bfloat16": {"enabled": true}, "aio": {"thread_count": 4})"));
  EXPECT_OK(r);
  EXPECT_EQ(r.at("zero_optimization.stage3_gather_16bit_weights_on_model_save"), true);
  EXPECT_EQ(r.at("bf16.enabled"), true);
  EXPECT_EQ(r.at("aio.intra_op_parallelism"), 4);
  EXPECT_WARNING(r, "zero_optimization.stage3_gather_fp16_weights_on_model_save: deprecated");
  EXPECT_WARNING(r, "bfloat16: deprecated; renamed bf16");
  // aio.thread_count moves quietly (PyTorch Lightning writes it; DeepSpeed drops it silently):
  // a note, no warning.
  for (const auto& w : r.warnings) EXPECT_EQ(w.find("thread_count"), std::string::npos) << w;
  bool noted = false;
  for (const auto& n : r.notes)
    noted |= n.rfind("aio.thread_count -> aio.intra_op_parallelism", 0) == 0;
  EXPECT_TRUE(noted);
}

TEST(Deprecated, DeprecatedAndNewKeyTogetherIsAnError) {
  EXPECT_ERROR(check(with_batch(R"("bf16": {"enabled": true}, "bfloat16": {"enabled": true})")),
               "sets the same thing (bf16)");
  EXPECT_ERROR(check(with_batch(R"("zero_optimization": {"stage": 2, "cpu_offload": true,
                                   "offload_optimizer": {"device": "cpu"}})")),
               "sets the same thing (zero_optimization.offload_optimizer)");
}

TEST(Deprecated, CpuOffloadFlagsBecomeOffloadSections) {
  const Resolution r = check(with_batch(R"("zero_optimization": {"stage": 3, "cpu_offload": true,
      "cpu_offload_param": true, "cpu_offload_use_pin_memory": true})"));
  EXPECT_OK(r);
  EXPECT_EQ(r.at("zero_optimization.offload_optimizer.device"), "cpu");
  EXPECT_EQ(r.at("zero_optimization.offload_param.device"), "cpu");
  EXPECT_EQ(r.at("zero_optimization.offload_optimizer.pin_memory"), true);
  EXPECT_WARNING(r, "zero_optimization.cpu_offload: deprecated");
  EXPECT_WARNING(r, "zero_optimization.cpu_offload_use_pin_memory: deprecated and has no effect");
  const Resolution off = check(
      with_batch(R"("zero_optimization": {"stage": 2, "cpu_offload": false})"));
  EXPECT_OK(off);
  EXPECT_TRUE(off.at("zero_optimization.offload_optimizer").is_null());
  // The advice for false never tells the user to write the setting that enables offload.
  EXPECT_WARNING(off,
                 "zero_optimization.cpu_offload: deprecated; false is the default (no "
                 "offload_optimizer): remove the key");
  EXPECT_FALSE(testing::has_message(off.warnings, "\"device\": \"cpu\""));
  // pydantic's lax booleans ("false", 0) get the same advice as false.
  const Resolution lax = check(
      with_batch(R"("zero_optimization": {"stage": 2, "cpu_offload": "false"})"));
  EXPECT_OK(lax);
  EXPECT_FALSE(testing::has_message(lax.warnings, "\"device\": \"cpu\""));
  EXPECT_ERROR(
      check(with_batch(R"("zero_optimization": {"cpu_offload_params": true})")),
      "zero_optimization.cpu_offload_params: unknown key; did you mean \"cpu_offload_param\"?");
}

TEST(Deprecated, BooleanZeroOptimizationMeansStageOne) {
  const Resolution r = check(R"({"train_batch_size": 8, "zero_optimization": true,
                                  "allgather_size": 1000})");
  EXPECT_OK(r);
  EXPECT_EQ(r.at("zero_optimization.stage"), 1);
  EXPECT_EQ(r.at("zero_optimization.allgather_bucket_size"), 1000);
  EXPECT_WARNING(r, "zero_optimization: the boolean form is deprecated");
  EXPECT_EQ(
      check(R"({"train_batch_size": 8, "zero_optimization": false})").at("zero_optimization.stage"),
      0);
}

TEST(UnknownKeys, StrictSectionsRejectWithASuggestion) {
  const Resolution r = check(with_batch(
      R"("zero_optimization": {"stage3_param_persitence_threshold": 1, "comm_overlap": true})"));
  EXPECT_ERROR(r,
               "zero_optimization.stage3_param_persitence_threshold: unknown key; did you "
               "mean \"stage3_param_persistence_threshold\"?");
  EXPECT_ERROR(r, "zero_optimization.comm_overlap: unknown key");
  EXPECT_ERROR(
      check(with_batch(R"("bf16": {"enabled": true, "loss_scale": 0})")),
      "bf16.loss_scale: unknown key; \"loss_scale\" is a key of \"fp16\", not of \"bf16\"");
}

TEST(UnknownKeys, PlainSectionsWarnInsteadAsDeepSpeedIgnoresThem) {
  const Resolution r = check(with_batch(R"("aio": {"block_sise": 4096}, "train_batch_sise": 3)"));
  EXPECT_OK(r);
  EXPECT_WARNING(r, "aio.block_sise: unknown key, ignored; did you mean \"block_size\"?");
  EXPECT_WARNING(r, "train_batch_sise: unknown key, ignored; did you mean \"train_batch_size\"?");
}

TEST(UnknownKeys, UnimplementedDeepSpeedFeaturesAreAcceptedWithAWarning) {
  const Resolution r = check(with_batch(R"("compression_training": {"x": 1},
      "curriculum_learning": {"enabled": false}, "comms_logger": {"enabled": true})"));
  EXPECT_OK(r);
  EXPECT_WARNING(r,
                 "compression_training: accepted for compatibility, but zerostream does not "
                 "implement this DeepSpeed feature");
  EXPECT_FALSE(testing::has_message(r.warnings, "curriculum_learning"));
  // Implemented (zerostream/comms_logging.py): no warning.
  EXPECT_FALSE(testing::has_message(r.warnings, "comms_logger"));
}

TEST(CommsLogger, ProfOpsMustBeAListOfNames) {
  const Resolution r = check(with_batch(R"("comms_logger": {"prof_ops": ["all_reduce"]})"));
  EXPECT_OK(r);
  EXPECT_EQ(r.at("comms_logger.prof_all"), true);  // DeepSpeed's default
  EXPECT_ERROR(check(with_batch(R"("comms_logger": {"prof_ops": "all_reduce"})")),
               "comms_logger.prof_ops: expected a list of collective names");
  EXPECT_ERROR(check(with_batch(R"("comms_logger": {"prof_ops": ["all_reduce", 3]})")),
               "comms_logger.prof_ops: expected a list of collective names");
}

TEST(Extensions, AioBackendAndChecksums) {
  const Resolution r = check(with_batch(R"("aio": {"backend": "threads"},
                                          "zerostream": {"verify_swap_checksums": true})"));
  EXPECT_OK(r);
  EXPECT_EQ(r.at("aio.backend"), "threads");
  EXPECT_EQ(r.at("zerostream.verify_swap_checksums"), true);
  EXPECT_EQ(r.at("zerostream.offload_gradient_dtype"), "auto");
  EXPECT_ERROR(check(with_batch(R"("zerostream": {"offload_gradient_dtype": "bf16"})")),
               "zerostream.offload_gradient_dtype: expected one of \"auto\", \"fp32\"; got "
               "\"bf16\"");
  EXPECT_ERROR(check(with_batch(R"("aio": {"backend": "libaio"})")),
               "aio.backend: expected one of \"auto\", \"io_uring\", \"threads\"; got \"libaio\"");
  EXPECT_ERROR(check(with_batch(R"("zerostream": {"verify": true})")),
               "zerostream.verify: unknown key");
}

TEST(Extensions, OptimizerMaxInCpuTakesElementsOrAuto) {
  const std::string nvme =
      R"("zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme",
         "nvme_path": "/tmp/zs"}}, )";
  EXPECT_EQ(check(with_batch(nvme + R"("zerostream": {})")).at("zerostream.optimizer_max_in_cpu"),
            0);
  const Resolution r = check(with_batch(nvme + R"("zerostream": {"optimizer_max_in_cpu": 5e8})"));
  EXPECT_OK(r);
  EXPECT_EQ(r.at("zerostream.optimizer_max_in_cpu"), 500000000);
  EXPECT_EQ(check(with_batch(nvme + R"("zerostream": {"optimizer_max_in_cpu": "auto"})"))
                .at("zerostream.optimizer_max_in_cpu"),
            "auto");
  EXPECT_ERROR(check(with_batch(R"("zerostream": {"optimizer_max_in_cpu": "lots"})")),
               "zerostream.optimizer_max_in_cpu: expected an integer or \"auto\"; got \"lots\"");
  EXPECT_ERROR(check(with_batch(R"("zerostream": {"optimizer_max_in_cpu": -1})")),
               "zerostream.optimizer_max_in_cpu: must be >= 0; got -1");
  // offload_param.max_in_cpu keeps DeepSpeed's integer and also takes "auto".
  EXPECT_EQ(
      check(with_batch(R"("zero_optimization": {"stage": 3, "offload_param": {"device": "nvme",
               "nvme_path": "/tmp/zs", "max_in_cpu": "auto"}})"))
          .at("zero_optimization.offload_param.max_in_cpu"),
      "auto");
  EXPECT_ERROR(
      check(with_batch(
          R"("zero_optimization": {"stage": 3, "offload_param": {"max_in_cpu": "most"}})")),
      "zero_optimization.offload_param.max_in_cpu: expected an integer or \"auto\"; got \"most\"");
  // Without NVMe offload there is nothing to split: said, not silently ignored.
  const Resolution cpu = check(with_batch(
      R"("zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
         "zerostream": {"optimizer_max_in_cpu": "auto"})"));
  EXPECT_OK(cpu);
  EXPECT_WARNING(cpu, "zerostream.optimizer_max_in_cpu: \"auto\" has no effect");
}

// Note [Message sizes]: a megabyte value, a 100,000-key object or a megabyte key is quoted
// as a prefix with its size, not whole. Found by tests/python/config/test_fuzz.py.
TEST(Messages, HugeValuesAndKeysAreClipped) {
  std::string wide = "{";
  for (int i = 0; i < 100000; ++i) wide += (i ? ", \"k" : "\"k") + std::to_string(i) + "\": 1";
  wide += "}";
  const std::string big(1000000, 'x');
  for (const std::string& text :
       {R"({"train_batch_size": ")" + big + "\"}", R"({"train_batch_size": )" + wide + "}",
        R"({"train_batch_size": 8, "zero_optimization": {")" + big + "\": 1}}"}) {
    const Resolution r = testing::check(text);
    ASSERT_EQ(r.errors.size(), 1u);
    EXPECT_LT(r.errors[0].size(), 1500u) << r.errors[0].substr(0, 300);
    EXPECT_TRUE(r.errors[0].find(" bytes in all)") != std::string::npos ||
                r.errors[0].find("(a key of 1000000 bytes): unknown key") != std::string::npos)
        << r.errors[0].substr(0, 300);
  }
  // The 200-byte cut falls inside the é (bytes 199 and 200 of the quoted value): it is left
  // out whole, so the message stays UTF-8.
  const std::string accents = R"({"train_batch_size": ")" + std::string(198, 'a') + "\xC3\xA9" +
                              std::string(1000, 'a') + "\"}";
  const std::string e = testing::check(accents).errors.at(0);
  EXPECT_NE(e.find(R"(got ")" + std::string(198, 'a') + "... (1202 bytes in all)"),
            std::string::npos)
      << e;
}

TEST(Messages, ManyUnknownKeysEndWithTheSectionPath) {
  std::string zero = "{";
  for (int i = 0; i < 25; ++i)
    zero += (i ? ", \"bogus_" : "\"bogus_") + std::to_string(i) + "\": 1";
  const Resolution r = testing::check(R"({"train_batch_size": 8, "zero_optimization": )" + zero +
                                      "}}");
  EXPECT_EQ(r.errors.size(), 21u);
  EXPECT_ERROR(r,
               "zero_optimization: more unknown keys than the 20 listed; the rest (from "
               "zero_optimization.bogus_20 on) are not listed");
}

TEST(AcceptedKeys, IncludeEveryAliasAndNestedSection) {
  const std::vector<std::string> keys = accepted_key_paths();
  for (const char* k : {"zero_optimization.offload_param.nvme_path",
                        "zero_optimization.prefetch_bucket_size", "aio.thread_count", "bfloat16",
                        "scheduler.params", "checkpoint.parallel_write.pipeline_stage"})
    EXPECT_NE(std::find(keys.begin(), keys.end(), k), keys.end()) << k;
}

}  // namespace
}  // namespace zs::config
