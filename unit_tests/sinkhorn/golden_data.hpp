// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Golden Sinkhorn data from the PyTorch generators in unit_tests/reference/:
// for a case `name` and dtype, unit_tests/data/sinkhorn/{name}_{f32|f64}_
// {x,g,r,dx}.npy hold X, G, the forward's R and autograd's dX, [batch, n, n].
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kdnn/io/npy.hpp"
#include "test_paths.hpp"

namespace kdnn_test {

/// One case's arrays, flat row-major, as double.
struct Golden {
  int batch = 0, n = 0;
  std::vector<double> x, g, r, dx;
};

/// "f32" for float, "f64" for double.
template <class T>
std::string dtype_suffix() {
  return sizeof(T) == 4 ? "f32" : "f64";
}

/// Reads a [batch, n, n] golden array of dtype T into `out` (ASSERTs: call
/// through ASSERT_NO_FATAL_FAILURE).
template <class T>
void load_array(const std::string& file, int& batch, int& n, std::vector<double>& out) {
  const auto a = kdnn::io::read_npy(data_dir() + "/sinkhorn/" + file);
  ASSERT_EQ(a.dtype, kdnn::io::dtype_of<T>()) << file;
  ASSERT_EQ(a.shape.size(), 3u) << file;
  ASSERT_EQ(a.shape[1], a.shape[2]) << file;
  ASSERT_GT(a.shape[0], 0u) << file;
  batch = int(a.shape[0]);
  n = int(a.shape[1]);
  out.assign(a.data<T>(), a.data<T>() + a.size());
}

/// Reads case `name`'s four arrays of dtype T, checking that their shapes
/// agree (ASSERTs: call through ASSERT_NO_FATAL_FAILURE).
template <class T>
void load_golden(const std::string& name, Golden& out) {
  const std::string prefix = name + "_" + dtype_suffix<T>() + "_";
  std::vector<double>* arrays[] = {&out.x, &out.g, &out.r, &out.dx};
  const char* suffixes[] = {"x", "g", "r", "dx"};
  for (int k = 0; k < 4; ++k) {
    int batch = 0, n = 0;
    ASSERT_NO_FATAL_FAILURE(load_array<T>(prefix + suffixes[k] + ".npy", batch, n, *arrays[k]));
    if (k > 0) {
      ASSERT_EQ(batch, out.batch) << prefix << suffixes[k];
      ASSERT_EQ(n, out.n) << prefix << suffixes[k];
    }
    out.batch = batch;
    out.n = n;
  }
}

}  // namespace kdnn_test
