// A small strict JSON reader for tests (the timeline must be valid JSON):
// parses the whole text into a tree or throws std::runtime_error with the offset.
#pragma once

#include <cctype>
#include <cstdlib>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace shoal::test::json {

struct Value {
  enum class Kind { Null, Bool, Number, String, Array, Object } kind = Kind::Null;
  bool boolean = false;
  double number = 0;
  std::string text;
  std::vector<Value> items;
  std::map<std::string, Value> members;
  bool has(const std::string& key) const { return kind == Kind::Object && members.count(key) > 0; }
  const Value& at(const std::string& key) const { return members.at(key); }
};

class Parser {
 public:
  explicit Parser(const std::string& text) : s_(text) {}
  Value parseDocument() {
    Value v = parseValue();
    skip();
    if (i_ != s_.size()) error("trailing characters");
    return v;
  }

 private:
  [[noreturn]] void error(const std::string& what) {
    throw std::runtime_error("JSON: " + what + " at offset " + std::to_string(i_));
  }
  void skip() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool take(char c) {
    skip();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!take(c)) error(std::string("expected '") + c + "'");
  }
  std::string parseString() {
    expect('"');
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (static_cast<unsigned char>(c) < 0x20) error("control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) error("unterminated escape");
      char e = s_[i_++];
      switch (e) {
        case '"': case '\\': case '/': out += e; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u':
          if (i_ + 4 > s_.size()) error("short \\u escape");
          out += static_cast<char>(std::strtol(s_.substr(i_, 4).c_str(), nullptr, 16));
          i_ += 4;
          break;
        default: error("bad escape");
      }
    }
    if (i_ >= s_.size()) error("unterminated string");
    ++i_;
    return out;
  }
  Value parseValue() {
    skip();
    if (i_ >= s_.size()) error("unexpected end");
    Value v;
    char c = s_[i_];
    if (c == '{') {
      ++i_;
      v.kind = Value::Kind::Object;
      if (take('}')) return v;
      do {
        skip();
        std::string key = parseString();
        expect(':');
        v.members[key] = parseValue();
      } while (take(','));
      expect('}');
    } else if (c == '[') {
      ++i_;
      v.kind = Value::Kind::Array;
      if (take(']')) return v;
      do v.items.push_back(parseValue());
      while (take(','));
      expect(']');
    } else if (c == '"') {
      v.kind = Value::Kind::String;
      v.text = parseString();
    } else if (s_.compare(i_, 4, "true") == 0) {
      v.kind = Value::Kind::Bool, v.boolean = true, i_ += 4;
    } else if (s_.compare(i_, 5, "false") == 0) {
      v.kind = Value::Kind::Bool, i_ += 5;
    } else if (s_.compare(i_, 4, "null") == 0) {
      i_ += 4;
    } else {
      const char* begin = s_.c_str() + i_;
      char* end = nullptr;
      v.kind = Value::Kind::Number;
      v.number = std::strtod(begin, &end);
      if (end == begin || !(c == '-' || std::isdigit(static_cast<unsigned char>(c)))) error("bad value");
      i_ += static_cast<size_t>(end - begin);
    }
    return v;
  }

  const std::string& s_;
  size_t i_ = 0;
};

inline Value parse(const std::string& text) { return Parser(text).parseDocument(); }

}  // namespace shoal::test::json
