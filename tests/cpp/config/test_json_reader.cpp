#include <gtest/gtest.h>

#include "common/check.h"
#include "config/json_reader.h"

namespace zs::config {
namespace {

std::string error_of(const std::string& text) {
  try {
    read_json_text(text, "f.json");
  } catch (const ValueError& e) {
    return e.what();
  }
  return "";
}

TEST(JsonReader, AcceptsCommentsAndTrailingCommasLikeHjson) {
  const Json j = read_json_text(R"({
    // a line comment
    # a hash comment
    "a": 1, /* block
    comment */ "b": [1, 2, 3,],
    "c": {"d": "x // not a comment",},
  })",
                                "f.json");
  EXPECT_EQ(j["a"], 1);
  EXPECT_EQ(j["b"].size(), 3u);
  EXPECT_EQ(j["c"]["d"], "x // not a comment");
}

TEST(JsonReader, KeepsIntegersApartFromFloats) {
  const Json j = read_json_text(R"({"i": 500000000, "e": 5e8, "f": 0.5, "n": -3})", "f.json");
  EXPECT_TRUE(j["i"].is_number_integer());
  EXPECT_TRUE(j["e"].is_number_float());
  EXPECT_DOUBLE_EQ(j["e"].get<double>(), 5e8);
  EXPECT_EQ(j["n"], -3);
}

TEST(JsonReader, DecodesEscapes) {
  const Json j = read_json_text(R"({"s": "a\"b\\c\n\u00e9\ud83d\ude00"})", "f.json");
  EXPECT_EQ(j["s"].get<std::string>(), "a\"b\\c\n\xc3\xa9\xf0\x9f\x98\x80");
}

TEST(JsonReader, DuplicateKeyNamesItsPath) {
  const std::string e = error_of(R"({"zero_optimization": {"stage": 1, "stage": 2}})");
  EXPECT_NE(e.find("f.json: zero_optimization.stage: duplicate key \"stage\""), std::string::npos)
      << e;
}

TEST(JsonReader, TemplatePlaceholderNamesItsKeyPathAndLine) {
  const std::string e = error_of("{\n  \"fp16\": {\n    \"enabled\": FP16_ENABLE\n  }\n}");
  EXPECT_NE(e.find("fp16.enabled: expected a JSON value, got the bare word FP16_ENABLE"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("line 3, column 16"), std::string::npos) << e;
}

TEST(JsonReader, PythonLiteralsGetAHint) {
  const std::string e = error_of(R"({"wall_clock_breakdown": True})");
  EXPECT_NE(e.find("wall_clock_breakdown: expected a JSON value, got the Python literal True"),
            std::string::npos)
      << e;
}

TEST(JsonReader, ArrayElementsArePartOfThePath) {
  const std::string e = error_of(R"({"optimizer": {"params": {"betas": [0.9, BETA2]}}})");
  EXPECT_NE(e.find("optimizer.params.betas[1]: expected a JSON value"), std::string::npos) << e;
}

TEST(JsonReader, StructuralErrors) {
  EXPECT_NE(error_of("").find("the file is empty"), std::string::npos);
  EXPECT_NE(error_of("[1, 2]").find("the top level must be a JSON object"), std::string::npos);
  EXPECT_NE(error_of(R"({"a": 1 "b": 2})").find("a: expected ',' or '}'"), std::string::npos);
  EXPECT_NE(error_of(R"({"a": "x)").find("unterminated string"), std::string::npos);
  EXPECT_NE(error_of(R"({a: 1})").find("expected a quoted key"), std::string::npos);
  EXPECT_NE(error_of(R"({"a": 1} extra)").find("unexpected text"), std::string::npos);
  EXPECT_NE(error_of(R"({"a": 1 /* open)").find("unterminated /* comment"), std::string::npos);
}

}  // namespace
}  // namespace zs::config
