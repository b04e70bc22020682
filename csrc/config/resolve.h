// From parsed JSON to a resolved config: every known key with its value and where that value
// came from, all errors and warnings collected in one pass (users fix a file once, not once
// per key).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "config/json_reader.h"
#include "config/schema.h"

namespace zs::config {

enum class Origin { kDefault, kFile, kAuto, kDerived };
const char* origin_name(Origin origin);

// What the run knows. It resolves "auto" and the batch rule; unset members fall back to
// DeepSpeed's defaults with a note naming the key.
struct RunContext {
  // Processes; divided by sequence_parallel_size for the data-parallel size. Unset (config
  // check without --world-size): the data-parallel size is taken as 1.
  std::optional<int64_t> world_size;
  // The engine needs a batch size; `config check` accepts a file that leaves it to the
  // launcher (HF Trainer, autotuning templates) with a warning.
  bool require_batch = false;
  std::optional<int64_t> train_batch_size;
  std::optional<int64_t> micro_batch_size;
  std::optional<int64_t> gradient_accumulation_steps;
  std::optional<int64_t> hidden_size;
  std::optional<std::string> model_dtype;  // "fp32", "fp16" or "bf16"
  std::optional<double> lr;
  std::optional<int64_t> total_num_steps;
};

struct Resolution {
  Json tree = Json::object();             // resolved values, nested as in ds_config
  std::map<std::string, Origin> origins;  // dotted key path -> where its value came from
  std::vector<std::string> errors;        // each starts with the key path
  std::vector<std::string> warnings;
  std::vector<std::string> notes;  // how "auto" and derived values were settled
  // world size / sequence_parallel_size, set by the batch rule (1 when the world is unknown).
  int64_t data_parallel_size = 1;

  bool ok() const { return errors.empty(); }
  // Value at a dotted path; null when absent.
  const Json& at(const std::string& path) const;
  void set(const std::string& path, Json value, Origin origin);
  bool given(const std::string& path) const;  // present in the file (or alias/deprecated key)
};

// Validates `input` against the schema and resolves "auto", derived values, the batch
// rule and the cross-field rules. Never throws for user errors: they are collected.
Resolution resolve(const Json& input, const RunContext& ctx);

// Parts of resolve(), one file each.
void walk_schema(const Json& input, Resolution& r);  // validate.cpp
// Validates `in` against `spec` and stores it under `prefix`, replacing what was there.
void walk_section(const Section& spec, const Json& in, const std::string& prefix,
                  Resolution& r);                                   // validate.cpp
void resolve_auto_and_derived(Resolution& r, const RunContext& c);  // auto.cpp
void resolve_batch(Resolution& r, const RunContext& c);             // batch.cpp
void check_cross_field_rules(Resolution& r);                        // rules.cpp
void check_optimizer_and_scheduler(Resolution& r);                  // optimizer_rules.cpp

std::string show(const Json& v);  // a value as it appears in messages
std::string dotted(const std::string& prefix, const std::string& key);

}  // namespace zs::config
