// The batch rule: train_batch_size = micro batch x gradient accumulation x data-parallel size.
// Any two determine the third by floor division, then the equality is checked, exactly as
// DeepSpeed's _set_batch_related_parameters / _batch_assertion (reference §1.3).
#include <optional>

#include "config/resolve.h"

namespace zs::config {
namespace {

constexpr const char* kTrain = "train_batch_size";
constexpr const char* kMicro = "train_micro_batch_size_per_gpu";
constexpr const char* kGas = "gradient_accumulation_steps";

struct Slot {
  const char* key;
  std::optional<int64_t> value;
  bool was_auto = false;
};

// micro x accumulation x world, or an error naming the keys when it overflows 64 bits
// (9223372036854775807 x 2 must not come out as a small positive batch).
std::optional<int64_t> product(Resolution& r, int64_t micro, int64_t gas, int64_t world) {
  int64_t a = 0, b = 0;
  if (__builtin_mul_overflow(micro, gas, &a) || __builtin_mul_overflow(a, world, &b)) {
    r.errors.push_back(std::string(kMicro) + " " + std::to_string(micro) + " * " + kGas + " " +
                       std::to_string(gas) + " * data-parallel world size " +
                       std::to_string(world) + ": the product (" + kTrain +
                       ") does not fit in a 64-bit integer");
    return std::nullopt;
  }
  return b;
}

Slot read(Resolution& r, const char* key, const std::optional<int64_t>& from_run) {
  Slot s{key, std::nullopt, false};
  auto it = r.origins.find(key);
  const Origin o = it == r.origins.end() ? Origin::kDefault : it->second;
  if (o == Origin::kFile && r.at(key).is_number_integer()) s.value = r.at(key).get<int64_t>();
  if (o == Origin::kAuto) {
    s.was_auto = true;
    s.value = from_run;
    if (from_run)
      r.notes.push_back(std::string(key) + ": \"auto\" -> " + std::to_string(*from_run) +
                        " (from the run)");
  }
  return s;
}

void store(Resolution& r, const Slot& s, bool derived) {
  if (!s.value) return;
  const Origin o = s.was_auto ? Origin::kAuto : (derived ? Origin::kDerived : Origin::kFile);
  r.set(s.key, *s.value, o);
}

// When train_batch_size is micro x accumulation x k for a k other than the world size, the
// tool that filled it counted k processes: say so. k == 1 with several ranks is what
// Accelerate (and so the HF Trainer and TRL) computes on a CPU machine when it picks no
// process-group backend and counts one process while torchrun started several.
std::string counted_other_world(const Slot& tb, const Slot& mb, const Slot& gas, int64_t w) {
  const int64_t per_rank = *mb.value * *gas.value;  // no overflow: product() checked it
  if (per_rank <= 0 || *tb.value % per_rank != 0) return "";
  const int64_t k = *tb.value / per_rank;
  std::string hint = "; train_batch_size is micro x accumulation x " + std::to_string(k) +
                     ", so whatever filled it counted " + std::to_string(k) + " process" +
                     (k == 1 ? "" : "es") + " where the process group has " + std::to_string(w) +
                     " data-parallel ranks";
  if (k == 1 && w > 1)
    hint +=
        ". Accelerate on a CPU machine counts one process when it picks no backend: pass "
        "Accelerator(kwargs_handlers=[InitProcessGroupKwargs(backend=\"gloo\")]); for the HF "
        "Trainer or TRL create accelerate.PartialState(backend=\"gloo\") before the "
        "TrainingArguments and give them accelerator_config={\"use_configured_state\": True} "
        "(docs/compat.md, Several CPU processes)";
  return hint;
}

}  // namespace

void resolve_batch(Resolution& r, const RunContext& c) {
  const int64_t sp = r.at("sequence_parallel_size").get<int64_t>();
  const int64_t world = c.world_size.value_or(sp);
  if (world <= 0) {
    r.errors.push_back("world size must be > 0; got " + std::to_string(world));
    return;
  }
  if (world % sp != 0) {
    r.errors.push_back("sequence_parallel_size: " + std::to_string(sp) +
                       " does not divide the world size " + std::to_string(world));
    return;
  }
  const int64_t w = world / sp;
  r.data_parallel_size = w;
  Slot tb = read(r, kTrain, c.train_batch_size);
  Slot mb = read(r, kMicro, c.micro_batch_size);
  Slot gas = read(r, kGas, c.gradient_accumulation_steps);
  const bool tb_in = tb.value.has_value(), mb_in = mb.value.has_value(),
             gas_in = gas.value.has_value();

  if (!tb_in && !mb_in && (tb.was_auto || mb.was_auto)) {
    mb.value = 1;
    r.notes.push_back(std::string(kMicro) + ": \"auto\" with no batch size from the run -> 1");
  }
  if (tb.value && mb.value && gas.value) {
    // All three known: only checked.
  } else if (tb.value && mb.value) {
    gas.value = *tb.value / *mb.value / w;
  } else if (tb.value && gas.value) {
    mb.value = *tb.value / w / *gas.value;
  } else if (mb.value && gas.value) {
    tb.value = product(r, *mb.value, *gas.value, w);
    if (!tb.value) return;
  } else if (tb.value) {
    gas.value = 1;
    mb.value = *tb.value / w;
  } else if (mb.value) {
    gas.value = 1;
    tb.value = product(r, *mb.value, 1, w);
    if (!tb.value) return;
  } else {
    const std::string msg = std::string(kTrain) + ", " + kMicro +
                            ": either train_batch_size or train_micro_batch_size_per_gpu "
                            "needs to be provided";
    if (c.require_batch) {
      r.errors.push_back(msg);
    } else {
      r.warnings.push_back(msg +
                           " by the run that uses this file (initialize() fails "
                           "without them)");
    }
    return;
  }
  store(r, tb, !tb_in);
  store(r, mb, !mb_in);
  store(r, gas, !gas_in);
  for (const Slot* s : {&tb, &mb, &gas}) {
    if (*s->value <= 0) {
      r.errors.push_back(std::string(s->key) + ": has to be greater than 0; got " +
                         std::to_string(*s->value) + " (world size " + std::to_string(w) + ")");
      return;
    }
  }
  const std::optional<int64_t> expected = product(r, *mb.value, *gas.value, w);
  if (!expected) return;
  if (*tb.value != *expected) {
    r.errors.push_back(std::string(kTrain) + ": " + std::to_string(*tb.value) +
                       " != train_micro_batch_size_per_gpu " + std::to_string(*mb.value) +
                       " * gradient_accumulation_steps " + std::to_string(*gas.value) +
                       " * data-parallel world size " + std::to_string(w) +
                       " (check batch related parameters)" + counted_other_world(tb, mb, gas, w));
  }
}

}  // namespace zs::config
