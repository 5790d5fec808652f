// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The parser of a .npy header's dict (npy.cpp reads the file around it).
#include <cctype>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "kdnn/core/error.hpp"
#include "kdnn/io/escape.hpp"

namespace kdnn::io::impl {

struct Header {
  std::string descr;  // the string value, or the raw text of a non-string value
  bool descr_is_string = true;
  bool fortran_order = false;
  std::vector<std::size_t> shape;
};

/// Parses the Python dict literal of a .npy header, e.g.
///   {'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }
/// Keys may come in any order; exactly these three keys are required.
class HeaderParser {
 public:
  HeaderParser(const std::string& path, const std::string& text) : path_(path), text_(text) {}

  Header parse() {
    Header header;
    bool seen_descr = false, seen_fortran = false, seen_shape = false;
    skip_space();
    expect('{');
    skip_space();
    while (!at('}')) {
      const std::string key = parse_string();
      skip_space();
      expect(':');
      skip_space();
      if (key == "descr") {
        mark_seen(seen_descr, key);
        parse_descr(header);
      } else if (key == "fortran_order") {
        mark_seen(seen_fortran, key);
        header.fortran_order = parse_bool();
      } else if (key == "shape") {
        mark_seen(seen_shape, key);
        header.shape = parse_shape();
      } else {
        malformed("unexpected key '" + key + "'");
      }
      skip_space();
      if (!at('}')) {
        expect(',');
        skip_space();
      }
    }
    ++pos_;  // the '}'
    skip_space();
    if (pos_ != text_.size()) malformed("unexpected text after the closing '}'");
    if (!seen_descr) malformed("missing key 'descr'");
    if (!seen_fortran) malformed("missing key 'fortran_order'");
    if (!seen_shape) malformed("missing key 'shape'");
    return header;
  }

 private:
  /// `what` may quote the header (a key), so it is escaped like the header
  /// (the parser's own words are printable ASCII: unchanged).
  [[noreturn]] void malformed(const std::string& what) const {
    const std::size_t end = text_.find_last_not_of(" \t\r\n");
    fail(path_, ": malformed header: ", escape_bytes(what),
         " (header: ", escape_bytes(end == std::string::npos ? "" : text_.substr(0, end + 1)), ")");
  }

  bool at(char c) const { return pos_ < text_.size() && text_[pos_] == c; }

  void skip_space() {
    while (pos_ < text_.size() && std::strchr(" \t\r\n", text_[pos_]) != nullptr) {
      ++pos_;
    }
  }

  void expect(char c) {
    if (!at(c)) {
      malformed(std::string("expected '") + c + "' at offset " + std::to_string(pos_));
    }
    ++pos_;
  }

  void mark_seen(bool& seen, const std::string& key) const {
    if (seen) malformed("duplicate key '" + key + "'");
    seen = true;
  }

  std::string parse_string() {
    if (!at('\'') && !at('"')) {
      malformed("expected a string at offset " + std::to_string(pos_));
    }
    const char quote = text_[pos_++];
    const std::size_t end = text_.find(quote, pos_);
    if (end == std::string::npos) malformed("unterminated string");
    std::string value = text_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return value;
  }

  /// A plain dtype string, or (for structured dtypes) the raw text of the
  /// list so that the "not supported" message can show it.
  void parse_descr(Header& header) {
    if (at('\'') || at('"')) {
      header.descr = parse_string();
      return;
    }
    const std::size_t begin = pos_;
    skip_bracketed();
    header.descr = text_.substr(begin, pos_ - begin);
    header.descr_is_string = false;
  }

  void skip_bracketed() {
    if (!at('[') && !at('(')) malformed("'descr' is neither a string nor a list");
    int depth = 0;
    do {
      if (pos_ >= text_.size()) malformed("unbalanced brackets in 'descr'");
      const char c = text_[pos_];
      if (c == '\'' || c == '"') {
        parse_string();
        continue;
      }
      if (c == '[' || c == '(') ++depth;
      if (c == ']' || c == ')') --depth;
      ++pos_;
    } while (depth > 0);
  }

  bool parse_bool() {
    for (const bool value : {true, false}) {
      const char* word = value ? "True" : "False";
      if (text_.compare(pos_, std::strlen(word), word) == 0) {
        pos_ += std::strlen(word);
        return value;
      }
    }
    malformed("'fortran_order' is not True or False");
  }

  /// A tuple of non-negative integers: (), (3,), (2, 3), (2, 3,).
  std::vector<std::size_t> parse_shape() {
    std::vector<std::size_t> shape;
    expect('(');
    skip_space();
    bool trailing_comma = false;
    while (!at(')')) {
      shape.push_back(parse_dim());
      skip_space();
      trailing_comma = at(',');
      if (!trailing_comma) break;
      ++pos_;
      skip_space();
    }
    expect(')');
    if (shape.size() == 1 && !trailing_comma) {
      malformed("'shape' is not a tuple (a 1-d shape is written '(n,)')");
    }
    return shape;
  }

  std::size_t parse_dim() {
    if (pos_ >= text_.size() || !std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
      malformed("expected a non-negative integer in 'shape' at offset " + std::to_string(pos_));
    }
    constexpr std::size_t max = std::numeric_limits<std::size_t>::max();
    std::size_t value = 0;
    while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
      const std::size_t digit = std::size_t(text_[pos_++] - '0');
      if (value > (max - digit) / 10) malformed("dimension in 'shape' is too large");
      value = value * 10 + digit;
    }
    if (at('L')) ++pos_;  // Python 2 long suffix, found in old files
    return value;
  }

  const std::string& path_;
  const std::string& text_;
  std::size_t pos_ = 0;
};

}  // namespace kdnn::io::impl
