// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// kdnn::io's .npy reader on headers written here: the variants NumPy's
// parser accepts, malformed headers and dtypes it does not support, damaged
// files (magic, version, truncation, trailing bytes, a huge shape), and
// the file's bytes escaped in the messages.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "expect_error.hpp"
#include "kdnn/io/escape.hpp"
#include "kdnn/io/npy.hpp"
#include "npy_test_files.hpp"

using kdnn::io::DType;
using kdnn::io::NpyArray;
using kdnn::io::read_npy;
using namespace kdnn_test;  // the fixture and the file helpers

namespace {

/// A version 1.0 .npy file with the given header dict (padded NumPy-style)
/// and data bytes.
std::string make_npy(std::string dict, const std::string& data) {
  while ((10 + dict.size() + 1) % 64 != 0) dict.push_back(' ');
  dict.push_back('\n');
  std::string bytes("\x93NUMPY\x01\x00", 8);
  bytes.push_back(char(dict.size() & 0xff));
  bytes.push_back(char(dict.size() >> 8));
  return bytes + dict + data;
}

/// `n` float64 values 1, 2, ..., n as raw bytes.
std::string f64_bytes(std::size_t n) {
  std::vector<double> values(n);
  for (std::size_t i = 0; i < n; ++i) values[i] = double(i + 1);
  return std::string(reinterpret_cast<const char*>(values.data()), n * sizeof(double));
}

/// No control bytes (NUL, ESC, newline, ...) and nothing beyond ASCII.
bool only_printable_ascii(const std::string& text) {
  for (const char c : text) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) {
      return false;
    }
  }
  return true;
}

}  // namespace

// ---- header parsing ----

TEST_F(Npy, HeaderVariantsAreAccepted) {
  const std::vector<std::string> dicts = {
      "{'shape': (2, 3), 'fortran_order': False, 'descr': '<f8'}",
      "{ \"descr\" : \"<f8\" ,\n\t'fortran_order':False,'shape':(2,3,) , }",
      "{'descr': '<f8', 'fortran_order': False, 'shape': (2L, 3L), }",
  };
  for (const auto& dict : dicts) {
    SCOPED_TRACE(dict);
    write_bytes(path("a.npy"), make_npy(dict, f64_bytes(6)));
    const NpyArray array = read_npy(path("a.npy"));
    EXPECT_EQ(array.dtype, DType::f64);
    EXPECT_EQ(array.shape, (std::vector<std::size_t>{2, 3}));
    EXPECT_EQ(array.data<double>()[5], 6.0);
  }
}

TEST_F(Npy, MalformedHeadersAreRejected) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{'descr': '<f8', 'fortran_order': False}", "missing key 'shape'"},
      {"{'descr': '<f8', 'fortran_order': False, 'shape': (3,), 'x': 1}", "unexpected key 'x'"},
      {"{'descr': '<f8', 'descr': '<f8', 'fortran_order': False, 'shape': (3,)}",
       "duplicate key 'descr'"},
      {"{'descr': '<f8', 'fortran_order': False, 'shape': (3)}", "not a tuple"},
      {"{'descr': '<f8', 'fortran_order': False, 'shape': (-3,)}", "non-negative integer"},
      {"{'descr': '<f8', 'fortran_order': 0, 'shape': (3,)}", "True or False"},
      {"{'descr': '<f8, 'fortran_order': False, 'shape': (3,)}", "malformed header"},
      {"{'descr': '<f8', 'fortran_order': False, 'shape': (3,)} x", "after the closing"},
      {"'descr': '<f8'", "expected '{'"},
  };
  for (const auto& [dict, part] : cases) {
    SCOPED_TRACE(dict);
    write_bytes(path("a.npy"), make_npy(dict, f64_bytes(3)));
    expect_read_error(path("a.npy"), {"malformed header", part});
  }
}

TEST_F(Npy, OtherDescrsAreRejected) {
  for (const std::string descr :
       {"<u8", "|u1", "|i1", "<i16", ">i8", "=i4", "|b1", "<c8", "<f16", "i4", "int32"}) {
    SCOPED_TRACE(descr);
    const std::string dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (1,), }";
    write_bytes(path("a.npy"), make_npy(dict, f64_bytes(1)));
    expect_read_error(path("a.npy"), {"dtype '" + descr + "' not supported"});
  }
}

// ---- damaged files ----

TEST_F(Npy, MissingFile) { expect_read_error(path("does_not_exist.npy"), {"cannot open"}); }

TEST_F(Npy, BadMagic) {
  write_bytes(path("a.npy"), "PK\x03\x04 this is a zip file, not an array");
  expect_read_error(path("a.npy"), {"not a .npy file"});
  write_bytes(path("short.npy"), "\x93NU");
  expect_read_error(path("short.npy"), {"not a .npy file"});
}

TEST_F(Npy, UnsupportedVersion) {
  std::string bytes = read_bytes(fixture("f64_4.npy"));
  bytes[6] = '\x04';
  write_bytes(path("a.npy"), bytes);
  expect_read_error(path("a.npy"), {"unsupported .npy format version 4.0"});
}

TEST_F(Npy, TruncatedHeader) {
  write_bytes(path("a.npy"), read_bytes(fixture("f64_4.npy")).substr(0, 40));
  expect_read_error(path("a.npy"), {"truncated", "bytes of header"});
}

TEST_F(Npy, TruncatedData) {
  const std::string bytes = read_bytes(fixture("f64_4.npy"));
  write_bytes(path("a.npy"), bytes.substr(0, bytes.size() - 3));
  expect_read_error(path("a.npy"), {"truncated: expected 32 bytes of data, found 29"});
}

TEST_F(Npy, TrailingBytes) {
  write_bytes(path("a.npy"), read_bytes(fixture("f64_4.npy")) + "xx");
  expect_read_error(path("a.npy"),
                    {"unexpected trailing bytes", "expected 32 bytes of data, found 34"});
}

TEST_F(Npy, HugeShapeIsRejectedWithoutAllocating) {
  const std::string dict =
      "{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296), }";
  write_bytes(path("a.npy"), make_npy(dict, f64_bytes(1)));
  expect_read_error(path("a.npy"), {"too large"});
}

// ---- bytes from the file are escaped in messages ----

TEST_F(Npy, HeaderBytesAreEscapedInMessages) {
  // A key holding a NUL, a terminal escape sequence, a backslash and a byte
  // beyond ASCII; the text after the NUL must not be lost.
  const std::string key = std::string("a", 1) + '\0' + "after\x1b[31mred\\\xff";
  const std::string dict =
      "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), '" + key + "': 1}";
  write_bytes(path("a.npy"), make_npy(dict, f64_bytes(3)));
  const std::string message = kdnn_test::error_of([&] { read_npy(path("a.npy")); });
  EXPECT_TRUE(only_printable_ascii(message)) << message;
  const std::string escaped = "a\\x00after\\x1b[31mred\\\\\\xff";
  expect_contains(message, "unexpected key '" + escaped + "'");
  expect_contains(message, "(header: {'descr': '<f8'");  // the header shown ...
  expect_contains(message, "'" + escaped + "': 1})");    // ... to its end, escaped
}

TEST_F(Npy, DescrBytesAreEscapedInMessages) {
  write_bytes(path("a.npy"),
              make_npy("{'descr': '<f8\x1b]0;title\x07', 'fortran_order': False, 'shape': (3,), }",
                       f64_bytes(3)));
  const std::string message = kdnn_test::error_of([&] { read_npy(path("a.npy")); });
  EXPECT_TRUE(only_printable_ascii(message)) << message;
  expect_contains(message, "dtype '<f8\\x1b]0;title\\x07' not supported");
}

TEST(NpyEscape, PrintableAsciiAsIsBackslashDoubledOtherBytesInLowercaseHex) {
  using kdnn::io::escape_bytes;
  EXPECT_EQ(escape_bytes(" az~'\""), " az~'\"");
  EXPECT_EQ(escape_bytes("a\\b"), "a\\\\b");
  EXPECT_EQ(escape_bytes(std::string("\0\n\x1b\x1f\x7f\x80\xff", 7)),
            "\\x00\\x0a\\x1b\\x1f\\x7f\\x80\\xff");
  EXPECT_EQ(escape_bytes(""), "");
}
