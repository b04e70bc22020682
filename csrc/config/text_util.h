// Small string helpers shared by the config sources.
#pragma once

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <string>
#include <vector>

namespace zs::config {

inline std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// "a.b.c" -> {"a", "b", "c"}
inline std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    parts.push_back(path.substr(start, dot - start));
    if (dot == std::string::npos) return parts;
    start = dot + 1;
  }
}

// Note [Message sizes]
// Messages quote what the user wrote, and hostile or generated input makes that large: a
// megabyte string, a 100,000-key object given where a number belongs, a key holding a NUL
// (which ended Python's copy of the message early). Quoted text is therefore cut to a
// readable prefix with its full size, and control bytes in keys are escaped.

// The first `max_bytes` of `s` (fewer, to end on a whole UTF-8 character), then
// "... (N bytes in all)" when anything was cut.
inline std::string clip(const std::string& s, size_t max_bytes) {
  if (s.size() <= max_bytes) return s;
  size_t end = max_bytes;
  while (end > 0 && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) --end;
  return s.substr(0, end) + "... (" + std::to_string(s.size()) + " bytes in all)";
}

// A key as it appears in a message's key path: control bytes as \u00XX (a NUL ended
// Python's copy of the message), at most about 64 bytes of it.
inline std::string key_text(const std::string& key) {
  constexpr size_t kShown = 64;
  static const char* hex = "0123456789abcdef";
  std::string out;
  size_t used = 0;
  for (; used < key.size() && out.size() < kShown; ++used) {
    const auto u = static_cast<unsigned char>(key[used]);
    if (u < 0x20 || u == 0x7F) {
      out += "\\u00";
      out += hex[u >> 4];
      out += hex[u & 0xF];
    } else {
      out += key[used];
    }
  }
  while (used < key.size() && (static_cast<unsigned char>(key[used]) & 0xC0) == 0x80)
    out += key[used++];  // the rest of a character cut in two
  if (used == key.size()) return out;
  return out + "... (a key of " + std::to_string(key.size()) + " bytes)";
}

}  // namespace zs::config
