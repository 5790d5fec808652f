// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Sinkhorn against golden data from PyTorch autograd through the reference
// forward (unit_tests/reference/gen_sinkhorn_golden.py): R from the forward,
// dX from autograd, in float64 and float32.
#include <string>

#include "golden_data.hpp"
#include "sinkhorn_test_util.hpp"

namespace {

using namespace kdnn_test;
namespace sk = kdnn::sinkhorn;

struct GoldenCase {
  std::string name;
  int iters;
};

template <class T>
void check_case(const GoldenCase& c) {
  const std::string prefix = c.name + "_" + dtype_suffix<T>();
  Golden d;
  ASSERT_NO_FATAL_FAILURE(load_golden<T>(c.name, d));
  const int batch = d.batch, n = d.n;

  auto X = batch_of<T>(d.x, batch, n);
  auto G = batch_of<T>(d.g, batch, n);
  auto Rg = batch_of<T>(d.r, batch, n);
  Batch<T> R("R", batch, n, n), dX("dX", batch, n, n);
  sk::forward(Space(), X, R, {c.iters});
  EXPECT_LT(rel_error(to_host(R), d.r), tol<T>(1e-13, 2e-6)) << prefix;

  sk::backward_unrolled(Space(), X, G, dX, {c.iters});
  EXPECT_LT(rel_error(to_host(dX), d.dx), tol<T>(1e-12, 2e-6)) << prefix << " unrolled";

  // Implicit and block from PyTorch's own R: the golden forwards have
  // converged to the working precision, so these match autograd.
  for (auto method : {sk::Method::implicit, sk::Method::block}) {
    sk::BackwardOptions o;
    o.method = method;
    sk::backward(Space(), Rg, G, dX, o);
    EXPECT_LT(rel_error(to_host(dX), d.dx), tol<T>(1e-9, 1e-5))
        << prefix << (method == sk::Method::block ? " block" : " implicit");
  }
}

const GoldenCase cases[] = {{"n4_it48", 48}, {"n16_it100", 100}};

TEST(SinkhornGolden, Float64) {
  for (const auto& c : cases) ASSERT_NO_FATAL_FAILURE(check_case<double>(c));
}

TEST(SinkhornGolden, Float32) {
  for (const auto& c : cases) ASSERT_NO_FATAL_FAILURE(check_case<float>(c));
}

}  // namespace
