// Schema walk: types, allowed values, unknown keys, aliases and deprecated keys.
#include <cmath>
#include <set>

#include "common/check.h"
#include "config/resolve.h"
#include "config/text_util.h"

namespace zs::config {

const char* origin_name(Origin origin) {
  switch (origin) {
    case Origin::kDefault: return "default";
    case Origin::kFile: return "file";
    case Origin::kAuto: return "auto";
    case Origin::kDerived: return "derived";
  }
  return "?";
}

// A value as quoted in messages, clipped (Note [Message sizes] in text_util.h). `replace`:
// a string that is not UTF-8 (only C++ callers can build one) is shown, not thrown on.
std::string show(const Json& v) {
  constexpr size_t kShownBytes = 200;
  return clip(v.dump(-1, ' ', false, Json::error_handler_t::replace), kShownBytes);
}

std::string dotted(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : prefix + "." + key;
}

namespace {

const Json kNull;

std::string number_text(double d) {
  if (d == std::floor(d) && std::fabs(d) < 1e15) return std::to_string(static_cast<int64_t>(d));
  return Json(d).dump();
}

std::string choices_text(const std::vector<Json>& choices) {
  std::string out;
  for (size_t i = 0; i < choices.size(); ++i) out += (i ? ", " : "") + show(choices[i]);
  return out;
}

// Coerces `v` to the key's type the way DeepSpeed's pydantic models do (lax mode), or
// returns an error message starting with the path.
std::optional<Json> coerce(const Key& k, const Json& v, const std::string& path, std::string& err) {
  if (v.is_null()) {
    if (k.nullable || k.kind == Kind::kAny) return v;
    err = path + ": expected a value; got null";
    return std::nullopt;
  }
  switch (k.kind) {
    case Kind::kAny:
    case Kind::kSection: return v;
    case Kind::kBool: {
      if (v.is_boolean()) return v;
      if (v.is_number_integer() && (v == 0 || v == 1)) return Json(v == 1);
      if (v.is_string()) {
        static const std::set<std::string> yes = {"true", "True", "yes", "on", "1"};
        static const std::set<std::string> no = {"false", "False", "no", "off", "0"};
        if (yes.count(v.get<std::string>())) return Json(true);
        if (no.count(v.get<std::string>())) return Json(false);
      }
      err = path + ": expected a boolean (true or false); got " + show(v);
      return std::nullopt;
    }
    case Kind::kInt:
    case Kind::kFloat: {
      if (k.auto_ok && v == "auto") return v;
      double d = 0;
      if (v.is_number()) {
        d = v.get<double>();
      } else {
        err = path + ": expected " + (k.kind == Kind::kInt ? "an integer" : "a number") +
              (k.auto_ok ? " or \"auto\"" : "") + "; got " + show(v);
        return std::nullopt;
      }
      Json out = v;
      if (k.kind == Kind::kInt) {
        if (!v.is_number_integer()) {
          if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) > 9.2e18) {
            err = path + ": expected an integer; got " + show(v) +
                  " (out of the 64-bit integer range)";
            return std::nullopt;
          }
          if (!std::isfinite(d) || d != std::floor(d)) {
            err = path + ": expected an integer; got " + show(v) + " (it has a fractional part)";
            return std::nullopt;
          }
          out = static_cast<int64_t>(d);
        }
      } else if (!std::isfinite(d)) {
        err = path + ": expected a finite number; got " + show(v);
        return std::nullopt;
      } else {
        out = d;
      }
      if (!k.choices.empty() &&
          std::find(k.choices.begin(), k.choices.end(), out) == k.choices.end()) {
        err = path + ": expected one of " + choices_text(k.choices) + "; got " + show(v);
        return std::nullopt;
      }
      if ((k.min && d < *k.min) || (k.max && d > *k.max) || (k.positive && d <= 0)) {
        std::string range = k.positive ? "> 0" : "";
        if (k.min) range = ">= " + number_text(*k.min);
        if (k.max) range += std::string(range.empty() ? "" : " and ") + "<= " + number_text(*k.max);
        err = path + ": must be " + range + "; got " + show(v);
        return std::nullopt;
      }
      return out;
    }
    case Kind::kString:
      if (v.is_string()) return v;
      err = path + ": expected a string; got " + show(v);
      return std::nullopt;
    case Kind::kEnum: {
      if (v.is_string()) {
        const std::string s = v.get<std::string>();
        for (const Json& c : k.choices) {
          const std::string cs = c.get<std::string>();
          if (cs == s) return c;
          if (k.case_insensitive && cs.size() == s.size() &&
              std::equal(cs.begin(), cs.end(), s.begin(),
                         [](char a, char b) { return std::tolower(a) == std::tolower(b); }))
            return c;
        }
      }
      err = path + ": expected one of " + choices_text(k.choices) + "; got " + show(v);
      // DeepSpeed's words for its one validated enum, which its users' tests match.
      if (path == "gradient_allreduce_op") err += " (Invalid gradient_allreduce_op)";
      return std::nullopt;
    }
  }
  return std::nullopt;
}

class Walker {
 public:
  explicit Walker(Resolution& r) : r_(r) {}

  // Replaces whatever `prefix` held (a pass-through leaf) by the keys of `spec`.
  void section_at(const Section& spec, const Json& in, const std::string& prefix) {
    for (auto it = r_.origins.lower_bound(prefix); it != r_.origins.end();) {
      if (it->first != prefix && it->first.rfind(prefix + ".", 0) != 0) break;
      it = r_.origins.erase(it);
    }
    r_.set(prefix, Json::object(), Origin::kFile);
    r_.origins.erase(prefix);
    section(spec, in, prefix);
  }

  void section(const Section& spec, const Json& in, const std::string& prefix) {
    if (!in.is_object()) {
      r_.errors.push_back((prefix.empty() ? std::string("(top level)") : prefix) +
                          ": expected an object; got " + show(in));
      return;
    }
    std::map<std::string, std::pair<const Key*, std::string>>
        dest;  // canonical -> (key, given name)
    for (auto it = in.begin(); it != in.end(); ++it) {
      const std::string& name = it.key();
      const std::string path = dotted(prefix, key_text(name));  // for messages only
      const Key* k = spec.find(name);
      if (k == nullptr) {
        unknown_key(spec, name, path);
        continue;
      }
      const Key* target = k;
      if (k->deprecation == Deprecation::kRename || k->deprecation == Deprecation::kQuietRename)
        target = spec.find(k->target);
      if (k->deprecation == Deprecation::kCpuOffload ||
          k->deprecation == Deprecation::kCpuOffloadParam)
        target = spec.find(k->target);
      auto [pos, fresh] = dest.emplace(target->name, std::make_pair(k, name));
      if (!fresh) {
        r_.errors.push_back(path + ": given together with \"" + pos->second.second +
                            "\", which sets the same thing (" + dotted(prefix, target->name) +
                            "); keep one");
        continue;
      }
    }
    for (const Key& k : spec.keys) {
      if (k.deprecation != Deprecation::kNone) continue;
      const std::string path = dotted(prefix, k.name);
      auto found = dest.find(k.name);
      if (found == dest.end()) {
        absent(k, path);
        continue;
      }
      const auto& [given_key, given_name] = found->second;
      const Json& v = in.at(given_name);
      if (given_key->deprecation != Deprecation::kNone) {
        deprecated(*given_key, k, v, dotted(prefix, given_name), path);
      } else {
        present(k, v, path);
      }
    }
    for (const auto& [canonical, entry] : dest) {
      if (entry.first->deprecation == Deprecation::kWarnOnly)
        r_.warnings.push_back(dotted(prefix, entry.second) + ": deprecated and has no effect; " +
                              entry.first->note);
    }
  }

 private:
  Resolution& r_;

  // Past this many unknown keys the rest are counted, not spelled out (a generated file with
  // 80,000 stray keys must give a readable error, quickly).
  static constexpr int kUnknownKeysListed = 20;
  int unknown_keys_ = 0;

  void unknown_key(const Section& spec, const std::string& name, const std::string& path) {
    if (++unknown_keys_ > kUnknownKeysListed) {
      auto& out = spec.strict ? r_.errors : r_.warnings;
      const std::string more = (spec.path.empty() ? std::string("(top level)") : spec.path) +
                               ": more unknown keys than the " +
                               std::to_string(kUnknownKeysListed) + " listed; the rest (from " +
                               path + " on) are not listed";
      if (unknown_keys_ == kUnknownKeysListed + 1) out.push_back(more);
      return;
    }
    std::vector<std::string> names;
    for (const Key& k : spec.keys) {
      names.push_back(k.name);
      names.insert(names.end(), k.aliases.begin(), k.aliases.end());
    }
    const std::string guess = closest_match(name, names);
    std::string hint = guess.empty() ? "" : "; did you mean \"" + guess + "\"?";
    if (guess.empty()) {
      // A key that belongs to another section (bf16.loss_scale is an fp16 key).
      for (const Key& section : root_schema().keys) {
        if (section.kind == Kind::kSection && section.section != &spec &&
            section.section->find(name) != nullptr) {
          hint = "; \"" + name + "\" is a key of \"" + section.name + "\", not of \"" + spec.path +
                 "\"";
          break;
        }
      }
    }
    if (spec.strict) {
      std::string msg = path + ": unknown key" + hint;
      if (hint.empty()) {
        msg += " (allowed: ";
        for (size_t i = 0; i < spec.keys.size(); ++i) msg += (i ? ", " : "") + spec.keys[i].name;
        msg += ")";
      }
      r_.errors.push_back(msg);
    } else {
      r_.warnings.push_back(path + ": unknown key, ignored" + hint);
    }
  }

  void absent(const Key& k, const std::string& path) {
    if (k.kind == Kind::kSection && k.expand_default) {
      section(*k.section, Json::object(), path);
      return;
    }
    r_.set(path, k.kind == Kind::kSection ? Json() : k.default_value, Origin::kDefault);
  }

  void present(const Key& k, const Json& v, const std::string& path) {
    if (v.is_string() && v == "auto" && k.kind != Kind::kString && !k.auto_ok) {
      r_.set(path, v, Origin::kAuto);
      return;
    }
    if (k.kind == Kind::kSection) {
      if (v.is_null() && k.nullable) {
        r_.set(path, nullptr, Origin::kFile);
      } else {
        section(*k.section, v, path);
      }
      return;
    }
    std::string err;
    if (auto value = coerce(k, v, path, err)) {
      r_.set(path, *value, Origin::kFile);
    } else {
      r_.errors.push_back(err);
    }
  }

  void deprecated(const Key& old_key, const Key& target, const Json& v, const std::string& old_path,
                  const std::string& path) {
    if (old_key.deprecation == Deprecation::kRename) {
      r_.warnings.push_back(old_path + ": deprecated; " + old_key.note);
      present(target, v, path);
      return;
    }
    if (old_key.deprecation == Deprecation::kQuietRename) {
      r_.notes.push_back(old_path + " -> " + path + " (" + old_key.note + ")");
      present(target, v, path);
      return;
    }
    // cpu_offload / cpu_offload_param: a boolean that stands for {"device": "cpu"}.
    std::string err;
    auto on = coerce(old_key, v, old_path, err);
    if (!on) {
      r_.errors.push_back(err);
      return;
    }
    if (*on == true) {
      r_.warnings.push_back(old_path + ": deprecated; " + old_key.note);
      section(*target.section, Json{{"device", "cpu"}}, path);
    } else {
      // The note shows how to turn offload on; false asks for the default.
      r_.warnings.push_back(old_path + ": deprecated; false is the default (no " + target.name +
                            "): remove the key");
      absent(target, path);
    }
  }
};

}  // namespace

const Json& Resolution::at(const std::string& path) const {
  const Json* node = &tree;
  for (const std::string& part : split_path(path)) {
    if (!node->is_object()) return kNull;
    auto it = node->find(part);
    if (it == node->end()) return kNull;
    node = &*it;
  }
  return *node;
}

void Resolution::set(const std::string& path, Json value, Origin origin) {
  Json* node = &tree;
  for (const std::string& part : split_path(path)) {
    if (!node->is_object()) *node = Json::object();
    node = &(*node)[part];
  }
  *node = std::move(value);
  origins[path] = origin;
}

bool Resolution::given(const std::string& path) const {
  auto it = origins.find(path);
  if (it != origins.end()) return it->second == Origin::kFile || it->second == Origin::kAuto;
  // A section counts as given when any key below it came from the file.
  for (auto p = origins.lower_bound(path + "."); p != origins.end(); ++p) {
    if (p->first.rfind(path + ".", 0) != 0) break;
    if (p->second == Origin::kFile || p->second == Origin::kAuto) return true;
  }
  return false;
}

void walk_section(const Section& spec, const Json& in, const std::string& prefix, Resolution& r) {
  Walker(r).section_at(spec, in, prefix);
}

void walk_schema(const Json& input, Resolution& r) {
  Json in = input;
  // Deprecated boolean form: "zero_optimization": true means stage 1 (false: stage 0),
  // with the top-level allgather_size as the all-gather bucket.
  if (in.contains("zero_optimization") && in["zero_optimization"].is_boolean()) {
    const bool on = in["zero_optimization"].get<bool>();
    Json z = {{"stage", on ? 1 : 0}};
    if (on && in.contains("allgather_size")) z["allgather_bucket_size"] = in["allgather_size"];
    in["zero_optimization"] = z;
    r.warnings.push_back(std::string("zero_optimization: the boolean form is deprecated; ") +
                         "use {\"stage\": " + (on ? "1" : "0") + "}");
  }
  Walker(r).section(root_schema(), in, "");
}

Resolution resolve(const Json& input, const RunContext& ctx) {
  Resolution r;
  walk_schema(input, r);
  if (!r.ok()) return r;  // later rules read typed values; they need a valid tree
  check_optimizer_and_scheduler(r);
  resolve_auto_and_derived(r, ctx);
  resolve_batch(r, ctx);
  check_cross_field_rules(r);
  return r;
}

}  // namespace zs::config
