// The accepted ds_config keys: names, aliases, types, defaults, allowed values and
// deprecations, as one table (facts: shared/reference/deepspeed_compat.md §1).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "config/json_reader.h"

namespace zs::config {

enum class Kind {
  kBool,     // true/false (also 0/1 and "true"/"false", as pydantic's lax mode)
  kInt,      // integer; an integral float such as 5e8 is accepted
  kFloat,    // any number
  kString,   // text
  kEnum,     // one of `choices`
  kSection,  // a nested object with its own keys
  kAny,      // passed through unchecked (optimizer kwargs, other projects' sections)
};

// What a deprecated key does when present.
enum class Deprecation {
  kNone,
  kRename,           // value moves to `target` (same section)
  kQuietRename,      // as kRename, with a note instead of a warning (the user cannot act on it)
  kCpuOffload,       // true -> offload_optimizer = {"device": "cpu"}
  kCpuOffloadParam,  // true -> offload_param = {"device": "cpu"}
  kWarnOnly,         // accepted, no effect
};

struct Section;

struct Key {
  std::string name;  // canonical JSON key
  Kind kind = Kind::kAny;
  Json default_value;                // null: no value unless given
  std::vector<std::string> aliases;  // other accepted spellings (pydantic field names)
  bool nullable = false;
  bool required = false;             // no default: the file or the run must give it
  std::optional<double> min, max;    // inclusive bounds for numbers
  bool positive = false;             // numbers must be > 0
  bool auto_ok = false;              // kInt that also takes the string "auto" (planned at run time)
  std::vector<Json> choices;         // kEnum (strings) or kInt restricted values
  bool case_insensitive = false;     // kEnum
  const Section* section = nullptr;  // kSection
  bool expand_default = true;        // kSection absent: fill its defaults (true) or null
  Deprecation deprecation = Deprecation::kNone;
  std::string target;  // kRename target key name
  std::string note;    // shown with the deprecation warning

  Key& alias(std::string a) {
    aliases.push_back(std::move(a));
    return *this;
  }
  Key& allow_null() {
    nullable = true;
    return *this;
  }
  Key& must_be_given() {
    required = true;
    return *this;
  }
  Key& at_least(double v) {
    min = v;
    return *this;
  }
  Key& at_most(double v) {
    max = v;
    return *this;
  }
  Key& or_auto() {
    auto_ok = true;
    return *this;
  }
  Key& greater_than_zero() {
    positive = true;
    return *this;
  }
  Key& one_of(std::vector<Json> c) {
    choices = std::move(c);
    return *this;
  }
  Key& deprecated(Deprecation d, std::string tgt = "", std::string why = "") {
    deprecation = d;
    target = std::move(tgt);
    note = std::move(why);
    return *this;
  }
  Key& lazy() {
    expand_default = false;
    return *this;
  }
};

struct Section {
  std::string path;         // dotted path of this section ("" for the top level)
  bool strict = false;      // DeepSpeed validates it with pydantic: unknown keys are errors
  bool implemented = true;  // false: accepted for compatibility; zerostream ignores it
  std::vector<Key> keys;

  // Finds a key by its name or an alias; nullptr when unknown.
  const Key* find(const std::string& name) const;
  std::vector<std::string> key_names() const;
};

const Section& root_schema();

// Parameter keys of a built-in optimizer (lowercased type), or nullptr when the type's
// parameters are passed through unchecked (torch.optim classes, types zerostream lacks).
const Section* optimizer_params_schema(const std::string& type_lower);
// Same for the DeepSpeed LR schedules; nullptr for torch.optim.lr_scheduler classes.
const Section* scheduler_params_schema(const std::string& type);

// Optimizer type names DeepSpeed handles itself (any case; listed in display case), those
// zerostream implements, torch.optim classes, DeepSpeed schedules and torch schedules.
const std::vector<std::string>& deepspeed_optimizer_names();
bool zerostream_implements_optimizer(const std::string& type_lower);
const std::vector<std::string>& torch_optimizer_names();
const std::vector<std::string>& deepspeed_scheduler_names();
const std::vector<std::string>& torch_scheduler_names();

// Every accepted key path ("zero_optimization.offload_param.device"); pinned by a test.
std::vector<std::string> accepted_key_paths();

// The closest of `candidates` to `word` (edit distance, case-insensitive), or "".
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace zs::config
