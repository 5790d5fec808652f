// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// One golden-data case written by a generator in unit_tests/reference/: its
// arrays {prefix}{array}.npy and {prefix}meta.json, a flat JSON object of
// numbers, booleans and null (all the generators write). The loaders ASSERT:
// call them through ASSERT_NO_FATAL_FAILURE.
#include <gtest/gtest.h>

#include <cctype>
#include <cstddef>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "kdnn/io/npy.hpp"
#include "test_paths.hpp"

namespace kdnn_test {

struct GoldenCase {
  std::string prefix;  ///< e.g. data_dir() + "/ssm/conv_k4_"
  std::string path(const std::string& array, const char* ext = ".npy") const {
    return prefix + array + ext;
  }
  bool has(const std::string& array) const { return std::ifstream(path(array)).good(); }
};

/// Reads `array`, of `dtype` (float32, float64, or an integer type read as
/// int), into `out`; `shape` holds the expected extents (0: any) and gets the
/// actual ones.
inline void load(const GoldenCase& f, const std::string& array, kdnn::io::DType dtype,
                 std::vector<std::size_t>& shape, std::vector<double>& out) {
  using kdnn::io::DType;
  const auto a = kdnn::io::read_npy(f.path(array));
  ASSERT_EQ(a.dtype, dtype) << f.path(array);
  ASSERT_EQ(a.shape.size(), shape.size()) << f.path(array);
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] != 0) {
      ASSERT_EQ(a.shape[d], shape[d]) << f.path(array) << " extent " << d;
    }
  }
  shape = a.shape;
  if (dtype == DType::f32) {
    out.assign(a.data<float>(), a.data<float>() + a.size());
  } else if (dtype == DType::f64) {
    out.assign(a.data<double>(), a.data<double>() + a.size());
  } else {
    const auto ints = kdnn::io::read_int_vector(a, f.path(array));
    out.assign(ints.begin(), ints.end());
  }
}

/// The values of meta.json as their text, by key.
inline void load_meta(const GoldenCase& f, std::map<std::string, std::string>& meta) {
  std::ifstream in(f.path("meta", ".json"));
  ASSERT_TRUE(in.good()) << f.path("meta", ".json");
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string text;
  for (char ch : buffer.str()) {
    if (!std::isspace(static_cast<unsigned char>(ch))) text += ch;
  }
  ASSERT_TRUE(text.size() >= 2 && text.front() == '{' && text.back() == '}') << text;
  std::stringstream items(text.substr(1, text.size() - 2));
  for (std::string item; std::getline(items, item, ',');) {
    const auto colon = item.find(':');
    ASSERT_TRUE(colon != std::string::npos && colon >= 2 && item.front() == '"' &&
                item[colon - 1] == '"')
        << "meta item " << item;
    meta[item.substr(1, colon - 2)] = item.substr(colon + 1);
  }
}

}  // namespace kdnn_test
