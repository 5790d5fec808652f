// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// What the tests of the Sinkhorn's forward and backwards share
// (test_sinkhorn.cpp, test_sinkhorn_backward.cpp): a random problem, runs of
// the forward and of the backwards on it (with the CG's report), and the
// typed suite's fixture.
#include <gtest/gtest.h>

#include <vector>

#include "kdnn/sinkhorn/sinkhorn.hpp"
#include "sinkhorn_test_util.hpp"
#include "views.hpp"

namespace kdnn_test {

/// The Sinkhorn's typed suite (float and double): one fixture for the files
/// whose tests are SinkhornTyped/0.* and SinkhornTyped/1.*, each declaring
/// the suite itself.
template <class T>
class SinkhornTyped : public ::testing::Test {};

/// A batch of n×n logits X (uniform in [0, spread]) and gradients G
/// (normal), for `iters` iterations.
struct Problem {
  int n, batch, iters;
  std::vector<double> x, g;
};

inline Problem make_problem(int n, int batch, int iters, double spread, unsigned seed) {
  return {n, batch, iters, uniform(std::size_t(batch) * n * n, 0.0, spread, seed),
          normal(std::size_t(batch) * n * n, seed + 1)};
}

/// Per-matrix CG diagnostics of a backward.
struct CGReport {
  std::vector<double> iterations, residual, marginal_error;
};

template <class T>
std::vector<double> run_backward(const Problem& p, kdnn::sinkhorn::BackwardOptions opts,
                                 CGReport* cg = nullptr) {
  auto X = batch_of<T>(p.x, p.batch, p.n);
  auto G = batch_of<T>(p.g, p.batch, p.n);
  Batch<T> R("R", p.batch, p.n, p.n), dX("dX", p.batch, p.n, p.n);
  kdnn::sinkhorn::forward(Space(), X, R, {p.iters});
  const auto report = Report::allocate(p.batch);
  kdnn::sinkhorn::backward(Space(), R, G, dX, opts, report);
  if (cg) {
    *cg = {to_host(report.iterations), to_host(report.residual), to_host(report.marginal_error)};
  }
  return to_host(dX);
}

template <class T>
Batch<T> run_forward(const Problem& p) {
  Batch<T> R("R", p.batch, p.n, p.n);
  kdnn::sinkhorn::forward(Space(), batch_of<T>(p.x, p.batch, p.n), R, {p.iters});
  return R;
}

template <class T>
std::vector<double> run_unrolled(const Problem& p) {
  auto X = batch_of<T>(p.x, p.batch, p.n);
  auto G = batch_of<T>(p.g, p.batch, p.n);
  Batch<T> dX("dX", p.batch, p.n, p.n);
  kdnn::sinkhorn::backward_unrolled(Space(), X, G, dX, {p.iters});
  return to_host(dX);
}

inline kdnn::sinkhorn::BackwardOptions with_method(kdnn::sinkhorn::Method m) {
  kdnn::sinkhorn::BackwardOptions o;
  o.method = m;
  return o;
}

}  // namespace kdnn_test
