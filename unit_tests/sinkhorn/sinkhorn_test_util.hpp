// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Helpers of the Sinkhorn tests: batches of n×n matrices on the default
// execution space, built and checked on the host in double.
#include <vector>

#include "allclose.hpp"
#include "expect_error.hpp"
#include "kdnn/sinkhorn/sinkhorn.hpp"
#include "sinkhorn_reference.hpp"
#include "views.hpp"

namespace kdnn_test {

template <class T>
using Batch = kdnn::sinkhorn::Batch<T, Space>;
using Report = kdnn::sinkhorn::Report<Space>;

/// A tolerance for scalar type T.
template <class T>
double tol(double for_double, double for_float) {
  return sizeof(T) == 8 ? for_double : for_float;
}

/// A [batch, n, n] batch holding `host` (row-major).
template <class T>
Batch<T> batch_of(const std::vector<double>& host, int batch, int n) {
  return to_device<T***>(host, batch, n, n);
}

/// Expects every matrix of the forward's output r ([batch, n, n]) to match
/// the plain formula on x with `iters` iterations, to relative error `bound`.
inline void expect_plain_formula(const std::vector<double>& r, const std::vector<double>& x,
                                 int batch, int n, int iters, double bound) {
  for (int b = 0; b < batch; ++b) {
    EXPECT_LT(rel_error(matrix(r, b, n), ref_forward(matrix(x, b, n), n, iters)), bound)
        << "n=" << n << " b=" << b;
  }
}

}  // namespace kdnn_test
