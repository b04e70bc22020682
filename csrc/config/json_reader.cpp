#include "config/json_reader.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <set>
#include <vector>

#include "common/check.h"
#include "config/text_util.h"

namespace zs::config {
namespace {

// A recursive-descent reader. nlohmann's parser cannot name the key path of an error,
// report duplicate keys, or skip '#' comments, all of which users of ds_config need.
//
// Hjson mode (DeepSpeed reads config files with hjson): entered only when the strict read
// meets an unquoted key, as `hjson.dump` writes them. Keys may then be unquoted, members and
// list items separated by line breaks instead of commas, and a value that is not a number,
// true, false, null, a quoted string, an object or a list is the rest of its line (hjson's
// quoteless string). JSON files never take this path, so their bare words (an unfilled
// template placeholder) stay errors.
class Reader {
 public:
  Reader(std::string_view text, std::string source, bool hjson)
      : s_(text), source_(std::move(source)), hjson_(hjson) {}

  Json document() {
    if (s_.substr(0, 3) == "\xEF\xBB\xBF") i_ = 3;  // a UTF-8 byte-order mark (Windows editors)
    check_utf8();
    skip_space();
    if (at_end()) fail("the file is empty; expected a JSON object");
    Json root = value();
    skip_space();
    if (!at_end()) fail("unexpected text after the closing brace");
    if (!root.is_object()) fail("the top level must be a JSON object");
    return root;
  }

 private:
  std::string_view s_;
  std::string source_;
  bool hjson_;
  size_t i_ = 0;
  std::vector<std::string> path_;
  int depth_ = 0;
  // ds_config files nest about 4 levels; deep nesting is hostile input that would otherwise
  // overflow the stack of this recursive reader.
  static constexpr int kMaxDepth = 64;
  // Python's json.dumps writes float("nan") and float("inf") of a dict config this way.
  static constexpr const char* kNoInfinity =
      "expected a JSON value, got NaN or Infinity, which JSON does not have (give a finite "
      "number)";

  void enter() {
    if (++depth_ > kMaxDepth)
      fail("nested deeper than " + std::to_string(kMaxDepth) + " levels of objects and lists");
  }

  // Python hands over valid UTF-8; C++ callers may not. Strings that are not UTF-8 would make
  // nlohmann's dump() throw (in messages) and Python's str() fail, far from the cause.
  void check_utf8() {
    const size_t start = i_;
    while (i_ < s_.size()) {
      const auto b = static_cast<unsigned char>(s_[i_]);
      // RFC 3629: the length from the lead byte, and the range of the second byte that rules
      // out overlong forms, surrogates (ED A0..BF) and code points past U+10FFFF.
      size_t n = 1;
      unsigned lo = 0x80, hi = 0xBF;
      if (b < 0x80) {
        n = 1;
      } else if (b >= 0xC2 && b <= 0xDF) {
        n = 2;
      } else if (b >= 0xE0 && b <= 0xEF) {
        n = 3;
        if (b == 0xE0) lo = 0xA0;
        if (b == 0xED) hi = 0x9F;
      } else if (b >= 0xF0 && b <= 0xF4) {
        n = 4;
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F;
      } else {
        n = 0;
      }
      bool ok = n > 0 && i_ + n <= s_.size();
      for (size_t k = 1; ok && k < n; ++k) {
        const auto c = static_cast<unsigned char>(s_[i_ + k]);
        ok = k == 1 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
      }
      if (!ok) {
        static const char* hex = "0123456789ABCDEF";
        fail(std::string("not UTF-8: byte 0x") + hex[b >> 4] + hex[b & 0xF] +
             " does not start a valid character (save the file as UTF-8)");
      }
      i_ += n;
    }
    i_ = start;
  }

  bool at_end() const { return i_ >= s_.size(); }
  char peek() const { return at_end() ? '\0' : s_[i_]; }

  std::string path_text() const {
    if (path_.empty()) return "(top level)";
    std::string out;
    for (const std::string& part : path_) {
      if (!out.empty() && (part.empty() || part[0] != '[')) out += '.';
      out += part;
    }
    return out;
  }

  [[noreturn]] void fail(const std::string& what) const {
    size_t line = 1, col = 1;
    for (size_t k = 0; k < i_ && k < s_.size(); ++k) {
      if (s_[k] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw ValueError(detail::concat(source_, ": ", path_text(), ": ", what, " (line ", line,
                                    ", column ", col, ")"));
  }

  void skip_space() {
    while (!at_end()) {
      const char c = s_[i_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++i_;
      } else if (c == '#' || (c == '/' && i_ + 1 < s_.size() && s_[i_ + 1] == '/')) {
        while (!at_end() && s_[i_] != '\n') ++i_;
      } else if (c == '/' && i_ + 1 < s_.size() && s_[i_ + 1] == '*') {
        const size_t end = s_.find("*/", i_ + 2);
        if (end == std::string_view::npos) fail("unterminated /* comment");
        i_ = end + 2;
      } else {
        return;
      }
    }
  }

  // skip_space(); whether it crossed a line break (hjson's separator).
  bool skip_space_over_line() {
    const size_t from = i_;
    skip_space();
    return s_.substr(from, i_ - from).find('\n') != std::string_view::npos;
  }

  // hjson: an unquoted key, up to its ':'.
  std::string bare_key() {
    const size_t start = i_;
    while (!at_end()) {
      const char c = s_[i_];
      if (c == ':' || c == ',' || c == '{' || c == '}' || c == '[' || c == ']' || c == ' ' ||
          c == '\t' || c == '\n' || c == '\r')
        break;
      ++i_;
    }
    if (i_ == start) fail("expected a key or '}'");
    return std::string(s_.substr(start, i_ - start));
  }

  // hjson: the rest of the line, trimmed; true, false and null keep their meaning.
  Json quoteless() {
    size_t end = s_.find('\n', i_);
    if (end == std::string_view::npos) end = s_.size();
    size_t last = end;
    while (last > i_ && (s_[last - 1] == ' ' || s_[last - 1] == '\t' || s_[last - 1] == '\r'))
      --last;
    const std::string w(s_.substr(i_, last - i_));
    i_ = end;
    if (w == "true") return Json(true);
    if (w == "false") return Json(false);
    if (w == "null") return Json(nullptr);
    return Json(w);
  }

  Json value() {
    const char c = peek();
    if (c == '{') return object();
    if (c == '[') return array();
    if (c == '"') return Json(string());
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    return word();
  }

  Json object() {
    enter();
    ++i_;  // '{'
    Json obj = Json::object();
    // ordered_json's operator[] searches its vector: keys are appended directly (duplicates
    // are found by `seen`), so an object of n keys reads in O(n log n), not O(n^2).
    auto& members = obj.get_ref<Json::object_t&>();
    std::set<std::string> seen;
    skip_space();
    if (peek() == '}') {
      ++i_;
      --depth_;
      return obj;
    }
    while (true) {
      skip_space();
      if (peek() == '}') {  // trailing comma, as hjson allows
        ++i_;
        --depth_;
        return obj;
      }
      if (peek() != '"' && !hjson_) fail("expected a quoted key or '}'");
      std::string key = peek() == '"' ? string() : bare_key();
      if (!seen.insert(key).second) {
        path_.push_back(key_text(key));
        fail("duplicate key \"" + key_text(key) + "\" (DeepSpeed rejects duplicate keys too)");
      }
      skip_space();
      if (peek() != ':') fail("expected ':' after key \"" + key_text(key) + "\"");
      ++i_;
      skip_space();
      path_.push_back(key_text(key));
      Json v = value();
      members.emplace_back(key, std::move(v));
      path_.pop_back();
      const bool line_break = skip_space_over_line();
      if (peek() == ',') {
        ++i_;
      } else if (peek() == '}') {
        ++i_;
        --depth_;
        return obj;
      } else if (hjson_ && line_break) {
        continue;  // hjson: a line break separates members
      } else {
        path_.push_back(key_text(key));
        fail("expected ',' or '}' after this value");
      }
    }
  }

  Json array() {
    enter();
    ++i_;  // '['
    Json arr = Json::array();
    while (true) {
      skip_space();
      if (peek() == ']') {
        ++i_;
        --depth_;
        return arr;
      }
      path_.push_back("[" + std::to_string(arr.size()) + "]");
      arr.push_back(value());
      path_.pop_back();
      const bool line_break = skip_space_over_line();
      if (peek() == ',') {
        ++i_;
      } else if (peek() != ']' && !(hjson_ && line_break)) {
        fail("expected ',' or ']' in this list");
      }
    }
  }

  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  unsigned hex4() {
    if (i_ + 4 > s_.size()) fail("truncated \\u escape");
    unsigned v = 0;
    for (int k = 0; k < 4; ++k) {
      const char h = s_[i_++];
      v <<= 4;
      if (h >= '0' && h <= '9')
        v |= h - '0';
      else if (h >= 'a' && h <= 'f')
        v |= h - 'a' + 10;
      else if (h >= 'A' && h <= 'F')
        v |= h - 'A' + 10;
      else
        fail("bad \\u escape");
    }
    return v;
  }

  // The character of a \uXXXX escape (i_ just past the 'u'), a UTF-16 surrogate pair read
  // as one. A surrogate on its own is no character: Python's json lets it through, but
  // encoded it is not UTF-8, and Python could not take the string back (UnicodeDecodeError).
  unsigned code_point() {
    const size_t escape = i_ - 2;
    const unsigned cp = hex4();
    const bool high = cp >= 0xD800 && cp < 0xDC00, low = cp >= 0xDC00 && cp < 0xE000;
    if (!high && !low) return cp;
    if (high && s_.substr(i_, 2) == "\\u") {
      i_ += 2;
      const unsigned lo = hex4();
      if (lo >= 0xDC00 && lo < 0xE000) return 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
    }
    const std::string text(s_.substr(escape, 6));
    i_ = escape;
    fail("\\u escape " + text + " is half of a UTF-16 surrogate pair without its other half " +
         "(not a character)");
  }

  std::string string() {
    ++i_;  // opening quote
    std::string out;
    while (true) {
      if (at_end()) fail("unterminated string");
      const char c = s_[i_++];
      if (c == '"') return out;
      if (c == '\n') fail("newline inside a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_end()) fail("unterminated string");
      const char e = s_[i_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          append_utf8(out, code_point());
          break;
        }
        default: fail(std::string("unknown escape \\") + e);
      }
    }
  }

  Json number() {
    const size_t start = i_;
    bool integral = true;
    if (peek() == '-') ++i_;
    while (!at_end()) {
      const char c = s_[i_];
      if (c >= '0' && c <= '9') {
        ++i_;
      } else if (c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') {
        integral = false;
        ++i_;
      } else {
        break;
      }
    }
    const std::string text(s_.substr(start, i_ - start));
    if (text == "-" && s_.substr(i_, 8) == "Infinity") {
      i_ = start;
      fail(kNoInfinity);
    }
    char* end = nullptr;
    errno = 0;
    if (integral) {
      const long long v = std::strtoll(text.c_str(), &end, 10);
      if (errno == 0 && end == text.c_str() + text.size()) return Json(static_cast<int64_t>(v));
    }
    errno = 0;
    const double d = std::strtod(text.c_str(), &end);
    if (end != text.c_str() + text.size() || text == "-") {
      i_ = start;
      fail("malformed number " + clip(text, 64));
    }
    // Beyond the double range strtod gives infinity, which nlohmann prints as null: a message
    // would then say "got null". Integers beyond int64 (finite here) are checked by key.
    if (std::isinf(d)) {
      i_ = start;
      fail("number " + clip(text, 64) + " is beyond the 64-bit float range (about 1.8e308)");
    }
    return Json(d);
  }

  Json word() {
    if (hjson_) return quoteless();
    const size_t start = i_;
    while (!at_end()) {
      const char c = s_[i_];
      if (c == ',' || c == '}' || c == ']' || c == '\n' || c == '\r' || c == ' ' || c == '\t')
        break;
      ++i_;
    }
    const std::string w(s_.substr(start, i_ - start));
    if (w == "true") return Json(true);
    if (w == "false") return Json(false);
    if (w == "null") return Json(nullptr);
    i_ = start;
    if (w.empty()) fail("expected a value");
    if (w == "True" || w == "False" || w == "None")
      fail("expected a JSON value, got the Python literal " + w +
           " (JSON spells it true, false or null)");
    if (w == "NaN" || w == "Infinity") fail(kNoInfinity);
    fail("expected a JSON value, got the bare word " + key_text(w) +
         " (an unfilled template placeholder? quote it or replace it with a value)");
  }
};

}  // namespace

Json read_json_text(std::string_view text, const std::string& source) {
  try {
    return Reader(text, source, /*hjson=*/false).document();
  } catch (const ValueError& strict) {
    // An unquoted key: the file is hjson (hjson.dump writes keys so); read it as hjson, and
    // report hjson's error if it is not that either.
    if (std::string(strict.what()).find("expected a quoted key") == std::string::npos) throw;
    return Reader(text, source, /*hjson=*/true).document();
  }
}

}  // namespace zs::config
