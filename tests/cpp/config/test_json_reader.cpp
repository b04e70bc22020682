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

// What Python's hjson.dump writes (DeepSpeed reads config files with hjson).
TEST(JsonReader, ReadsHjsonWhenKeysAreUnquoted) {
  const Json j = read_json_text(R"({
  train_batch_size: 1
  optimizer:
  {
    type: Adam
    params:
    {
      lr: 0.00015
      betas:
      [
        0.9
        0.999
      ]
    }
  }
  bf16:
  {
    enabled: true
  }
  "quoted": "still JSON", tag: two words
})",
                                "f.json");
  EXPECT_EQ(j["train_batch_size"], 1);
  EXPECT_TRUE(j["train_batch_size"].is_number_integer());
  EXPECT_EQ(j["optimizer"]["type"], "Adam");
  EXPECT_EQ(j["optimizer"]["params"]["lr"], 0.00015);
  EXPECT_EQ(j["optimizer"]["params"]["betas"].size(), 2u);
  EXPECT_EQ(j["bf16"]["enabled"], true);
  EXPECT_EQ(j["quoted"], "still JSON");
  EXPECT_EQ(j["tag"], "two words");  // a quoteless string runs to the end of its line
  // A JSON file (quoted keys) keeps refusing bare words: no hjson reading there.
  EXPECT_NE(error_of(R"({"a": FP16_ENABLE})").find("bare word"), std::string::npos);
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
  EXPECT_NE(error_of(R"({a 1})").find("expected ':' after key \"a\""), std::string::npos);
  EXPECT_NE(error_of(R"({"a": 1} extra)").find("unexpected text"), std::string::npos);
  EXPECT_NE(error_of(R"({"a": 1 /* open)").find("unterminated /* comment"), std::string::npos);
}

// What the config fuzz (tests/python/config/test_fuzz.py) found in the reader.

void expect_error(const std::string& text, const std::string& part, const std::string& where) {
  const std::string e = error_of(text);
  EXPECT_NE(e.find(part), std::string::npos) << "text: " << text << "\nerror: " << e;
  EXPECT_NE(e.find(where), std::string::npos) << "text: " << text << "\nerror: " << e;
}

// A lone surrogate was encoded as bytes that are not UTF-8 (Python's str() of the value and
// nlohmann's dump() in messages then failed), and a high surrogate before a non-surrogate
// escape became one wrong code point (U+11841 for \ud83d\u0041).
TEST(JsonReader, SurrogatesComeInPairs) {
  const std::string lone = "is half of a UTF-16 surrogate pair without its other half";
  expect_error(R"({"a": "x\ud800"})", "a: \\u escape \\ud800 " + lone, "(line 1, column 9)");
  expect_error(R"({"a": "\udfff\ud800"})", "\\u escape \\udfff", "(line 1, column 8)");
  expect_error(R"({"a": "\ud83d\u0041"})", "\\u escape \\ud83d", "(line 1, column 8)");
  expect_error(R"({"a": "\ud83d"})", "\\u escape \\ud83d", "(line 1, column 8)");
  expect_error(R"({"\ud800": 1})", "(top level): \\u escape \\ud800", "column 3");
  EXPECT_EQ(read_json_text(R"({"a": "\ud83d\ude80"})", "f.json")["a"], "\xF0\x9F\x9A\x80");
}

// Text that is not UTF-8 can only come from C++ callers (Python hands over str).
TEST(JsonReader, TextMustBeUtf8) {
  expect_error("{\"a\": \"\xFF\"}", "not UTF-8: byte 0xFF", "(line 1, column 8)");
  expect_error("{\"a\": \"\xC0\xAF\"}", "byte 0xC0", "column 8");          // overlong '/'
  expect_error("{\"a\": \"\xED\xA0\x80\"}", "byte 0xED", "column 8");      // a surrogate
  expect_error("{\"a\": \"\xF4\x90\x80\x80\"}", "byte 0xF4", "column 8");  // past U+10FFFF
  expect_error("{\"a\": \"\xE2\x82\"}", "byte 0xE2", "column 8");          // cut short
  expect_error("# \x80\n{}", "byte 0x80", "(line 1, column 3)");           // comments too
  const Json j = read_json_text("\xEF\xBB\xBF{\"a\": \"\xC3\xA9\xE2\x82\xAC\xF0\x9F\x9A\x80\"}",
                                "f");
  EXPECT_EQ(j["a"], "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x9A\x80");
}

// json.dumps writes float("nan") and float("inf") as NaN, Infinity and -Infinity: they were
// "an unfilled template placeholder?" and "malformed number -".
TEST(JsonReader, NaNAndInfinityAreNamed) {
  const std::string what = "expected a JSON value, got NaN or Infinity, which JSON does not have";
  for (const char* v : {"NaN", "Infinity", "-Infinity"})
    expect_error(std::string(R"({"lr": )") + v + "}", "lr: " + what, "(line 1, column 8)");
}

// strtod's infinity for 1e999 was kept, and nlohmann prints it as null: "got null".
TEST(JsonReader, NumbersBeyondTheDoubleRangeAreErrors) {
  expect_error(R"({"lr": 1e999})", "lr: number 1e999 is beyond the 64-bit float range",
               "(line 1, column 8)");
  expect_error(R"({"lr": -1e999})", "number -1e999", "column 8");
  expect_error("{\"lr\": " + std::string(400, '9') + "}", "is beyond the 64-bit float range",
               "column 8");
  EXPECT_EQ(read_json_text(R"({"lr": 1e-400})", "f")["lr"], 0.0);  // underflow is zero
  EXPECT_EQ(read_json_text(R"({"lr": 1e308})", "f")["lr"], 1e308);
}

// A NUL in a key ended Python's copy of the message; huge words and keys were quoted whole.
TEST(JsonReader, KeysAndWordsInMessagesAreEscapedAndClipped) {
  expect_error(std::string("{\"a\0b\": 1, \"a\0b\": 2}", 20),
               "a\\u0000b: duplicate key \"a\\u0000b\"", "line 1");
  const std::string e = error_of("{\"" + std::string(100000, 'k') +
                                 "\": " + std::string(100000, 'x') + "}");
  EXPECT_LT(e.size(), 400u) << e.substr(0, 400);
  EXPECT_NE(e.find("... (a key of 100000 bytes): expected a JSON value, got the bare word xxx"),
            std::string::npos)
      << e.substr(0, 400);
}

}  // namespace
}  // namespace zs::config
