// Helpers shared by the config tests.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "config/ds_config.h"

namespace zs::config::testing {

inline Resolution check(const std::string& text, RunContext ctx = {}) {
  return check_config(text, "test.json", ctx);
}

inline bool has_message(const std::vector<std::string>& messages, const std::string& part) {
  for (const std::string& m : messages)
    if (m.find(part) != std::string::npos) return true;
  return false;
}

inline std::string joined(const std::vector<std::string>& messages) {
  std::string out;
  for (const std::string& m : messages) out += m + "\n";
  return out;
}

#define EXPECT_ERROR(res, part)                                       \
  EXPECT_TRUE(::zs::config::testing::has_message((res).errors, part)) \
      << "wanted an error containing: " << (part) << "\ngot:\n"       \
      << ::zs::config::testing::joined((res).errors)
#define EXPECT_WARNING(res, part)                                       \
  EXPECT_TRUE(::zs::config::testing::has_message((res).warnings, part)) \
      << "wanted a warning containing: " << (part) << "\ngot:\n"        \
      << ::zs::config::testing::joined((res).warnings)
#define EXPECT_OK(res) EXPECT_TRUE((res).ok()) << ::zs::config::testing::joined((res).errors)

}  // namespace zs::config::testing
