// Small string helpers shared by the config sources.
#pragma once

#include <algorithm>
#include <cctype>
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

}  // namespace zs::config
