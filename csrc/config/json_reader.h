// Reads ds_config text the way DeepSpeed's hjson reading tolerates it (// # /* */ comments,
// trailing commas; a file with unquoted keys as hjson: line breaks as separators, quoteless
// strings) while keeping JSON's types, and fails with the key path on anything else.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace zs::config {

// Key order is kept so that resolved configs print in the user's order.
using Json = nlohmann::ordered_json;

// Parses `text` (named `source` in messages). Throws zs::ValueError naming the key path,
// line and column for: syntax errors, duplicate keys (DeepSpeed rejects them too), bare
// words such as unfilled template placeholders (`"enabled": FP16_ENABLE`), NaN and
// Infinity, numbers beyond the double range, text that is not UTF-8 and \u escapes of half
// a surrogate pair (so every string read is UTF-8, as Python needs it).
// Integers stay integers; numbers with a fraction or exponent become doubles.
Json read_json_text(std::string_view text, const std::string& source);

}  // namespace zs::config
