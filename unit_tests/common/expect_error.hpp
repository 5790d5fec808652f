// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// EXPECT_KDNN_ERROR(statement, fragment): the statement throws kdnn::Error
// whose message contains `fragment`. Fails, saying which, when nothing is
// thrown, when another exception is thrown, or when the message differs.
#include <exception>
#include <string>

#include <gtest/gtest.h>

#include "kdnn/core/error.hpp"

namespace kdnn_test {

struct Thrown {
  enum Kind { nothing, kdnn_error, other } kind = nothing;
  std::string message;
};

template <class F>
Thrown thrown_by(F&& f) {
  try {
    f();
  } catch (const kdnn::Error& e) {
    return {Thrown::kdnn_error, e.what()};
  } catch (const std::exception& e) {
    return {Thrown::other, e.what()};
  } catch (...) {
    return {Thrown::other, "(not a std::exception)"};
  }
  return {};
}

/// The kdnn::Error message `f` throws, "" if it throws none.
template <class F>
std::string error_of(F&& f) {
  const Thrown t = thrown_by(f);
  return t.kind == Thrown::kdnn_error ? t.message : "";
}

inline ::testing::AssertionResult is_kdnn_error_with(const char* stmt, const char*, const Thrown& t,
                                                     const std::string& fragment) {
  switch (t.kind) {
    case Thrown::nothing:
      return ::testing::AssertionFailure()
             << stmt << " threw nothing; expected kdnn::Error containing \"" << fragment << "\"";
    case Thrown::other:
      return ::testing::AssertionFailure()
             << stmt << " threw another exception (\"" << t.message
             << "\"); expected kdnn::Error containing \"" << fragment << "\"";
    case Thrown::kdnn_error:
      break;
  }
  if (t.message.find(fragment) == std::string::npos) {
    return ::testing::AssertionFailure() << stmt << " threw kdnn::Error \"" << t.message
                                         << "\", expected it to contain \"" << fragment << "\"";
  }
  return ::testing::AssertionSuccess();
}

#define EXPECT_KDNN_ERROR(stmt, fragment)                                                     \
  EXPECT_PRED_FORMAT2(::kdnn_test::is_kdnn_error_with, ::kdnn_test::thrown_by([&] { stmt; }), \
                      std::string(fragment))                                                  \
      << #stmt

}  // namespace kdnn_test
