// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The Sinkhorn's validation errors: bad shapes, overlapping outputs and
// reports, options out of range, and problems too large for the scratch,
// each a kdnn::Error naming what is wrong.
#include <cmath>
#include <string>

#include "kdnn/core/impl/backend_traits.hpp"
#include "sinkhorn_test_util.hpp"

namespace {

using namespace kdnn_test;
namespace sk = kdnn::sinkhorn;

// ---- validation ------------------------------------------------------------

TEST(Sinkhorn, ValidationErrors) {
  Batch<float> X("X", 2, 4, 4), R("R", 2, 4, 4), G("G", 2, 4, 4), dX("dX", 2, 4, 4);
  Batch<float> wrong_n("w", 2, 5, 5), wrong_b("wb", 3, 4, 4), rect("rect", 2, 4, 5);
  EXPECT_KDNN_ERROR(
      sk::forward(Space(), rect, R),
      "sinkhorn::forward: X must be a batch of square matrices [B, n, n], got [2, 4, 5]");
  EXPECT_KDNN_ERROR(sk::forward(Space(), X, wrong_n),
                    "sinkhorn::forward: R has extent(1)=5, expected 4 (same as X)");
  EXPECT_KDNN_ERROR(sk::forward(Space(), X, wrong_b), "R has extent(0)=3, expected 2 (same as X)");
  EXPECT_KDNN_ERROR(sk::forward(Space(), X, X), "output R overlaps input X");
  EXPECT_KDNN_ERROR(sk::forward(Space(), X, R, {0}), "iters=0, expected a value in [1, ");
  EXPECT_KDNN_ERROR(sk::forward(Space(), X, R, {10, -1.0}), "tol=-1, expected a finite value >= 0");
  EXPECT_KDNN_ERROR(sk::forward(Space(), X, R, {10, std::nan("")}), "tol=nan");
  sk::ForwardOptions f;
  f.eps = -1e-3;
  EXPECT_KDNN_ERROR(sk::forward(Space(), X, R, f), "eps=-0.001, expected a value in [0, 1]");
  f.eps = std::nan("");
  EXPECT_KDNN_ERROR(sk::backward_unrolled(Space(), X, G, dX, f),
                    "eps=nan, expected a value in [0, 1]");
  Batch<float> X0("X0", 2, 0, 0), R0("R0", 2, 0, 0);
  EXPECT_KDNN_ERROR(sk::forward(Space(), X0, R0),
                    "sinkhorn::forward: X has shape [2, 0, 0], expected n >= 1");
  EXPECT_KDNN_ERROR(sk::backward(Space(), X0, X0, R0),
                    "sinkhorn::backward: R has shape [2, 0, 0], expected n >= 1");
  // A report written over an operand would corrupt it.
  Kokkos::View<double*, Space::memory_space> over_x(reinterpret_cast<double*>(X.data()), 2);
  Report aliased;
  aliased.marginal_error = over_x;
  EXPECT_KDNN_ERROR(sk::forward(Space(), X, R, {}, aliased),
                    "output report.marginal_error overlaps input X");
  Report aliased_it;
  aliased_it.iterations =
      Kokkos::View<int*, Space::memory_space>(reinterpret_cast<int*>(R.data()), 2);
  EXPECT_KDNN_ERROR(sk::backward(Space(), R, G, dX, {}, aliased_it),
                    "output report.iterations overlaps input R");
  Report aliased_res;
  aliased_res.residual =
      Kokkos::View<double*, Space::memory_space>(reinterpret_cast<double*>(dX.data()) + 3, 2);
  EXPECT_KDNN_ERROR(sk::backward(Space(), R, G, dX, {}, aliased_res),
                    "output report.residual overlaps input dX");
  Report self = Report::allocate(2);
  self.residual = self.marginal_error;
  EXPECT_KDNN_ERROR(sk::backward(Space(), R, G, dX, {}, self),
                    "report.marginal_error overlaps input report.residual");
  Report bad{Kokkos::View<int*, Space::memory_space>("it", 3), {}};
  EXPECT_KDNN_ERROR(sk::forward(Space(), X, R, {}, bad),
                    "report.iterations has extent(0)=3, expected 2 (batch size)");
  Report bad_err;
  bad_err.residual = Kokkos::View<double*, Space::memory_space>("e", 1);
  EXPECT_KDNN_ERROR(sk::backward(Space(), R, G, dX, {}, bad_err),
                    "report.residual has extent(0)=1, expected 2");

  EXPECT_KDNN_ERROR(sk::backward(Space(), R, wrong_n, dX),
                    "sinkhorn::backward: G has extent(1)=5, expected 4 (same as R)");
  EXPECT_KDNN_ERROR(sk::backward(Space(), R, G, wrong_b),
                    "sinkhorn::backward: dX has extent(0)=3, expected 2 (same as R)");
  EXPECT_KDNN_ERROR(sk::backward(Space(), rect, G, dX),
                    "sinkhorn::backward: R must be a batch of square matrices");
  EXPECT_KDNN_ERROR(sk::backward(Space(), R, G, G), "output dX overlaps input G");
  EXPECT_KDNN_ERROR(sk::backward(Space(), R, G, R), "output dX overlaps input R");
  sk::BackwardOptions o;
  o.rtol = 1.5;
  EXPECT_KDNN_ERROR(sk::backward(Space(), R, G, dX, o), "rtol=1.5, expected a value in [0, 1)");
  o = {};
  o.max_iters = -2;
  EXPECT_KDNN_ERROR(sk::backward(Space(), R, G, dX, o), "max_iters=-2, expected >= 0");
  o = {};
  o.launch.tile = -1;
  EXPECT_KDNN_ERROR(sk::backward(Space(), R, G, dX, o), "launch.tile=-1, expected >= 0");
  o = {};
  o.launch.vector_length = 3;
  EXPECT_KDNN_ERROR(sk::backward(Space(), R, G, dX, o),
                    "launch.vector_length=3, expected a power of two");
  o = {};
  o.launch.team_size = 100000;
  EXPECT_KDNN_ERROR(sk::backward(Space(), R, G, dX, o),
                    "launch.team_size=100000, expected at most");

  EXPECT_KDNN_ERROR(sk::backward_unrolled(Space(), X, wrong_n, dX),
                    "sinkhorn::backward_unrolled: G has extent(1)=5, expected 4 (same as X)");
  EXPECT_KDNN_ERROR(sk::backward_unrolled(Space(), X, G, X), "output dX overlaps input X");
  EXPECT_KDNN_ERROR(sk::backward_unrolled(Space(), X, G, dX, {10, 1e-6}), "tol=1e-06, expected 0");
  EXPECT_KDNN_ERROR(sk::backward_unrolled(Space(), X, G, dX, {-3}), "iters=-3");
}

TEST(Sinkhorn, TooLargeForScratchIsAClearError) {
  // The limit of a default launch: level 1's on a host, the team workspace's
  // budget on a GPU.
  const char* what = nullptr;
  const std::size_t limit =
      kdnn::impl::scratch_limit<Space>(kdnn::impl::is_gpu_launch<Space>(kdnn::Launch{}), what);
  // Smallest power-of-two n whose working set exceeds it.
  sk::impl::CGBackwardKernel<Space, double> cg;
  cg.n = 1;
  while (cg.matrix_bytes() <= limit) cg.n *= 2;
  const int n = cg.n;
  Batch<double> R1(Kokkos::view_alloc(Kokkos::WithoutInitializing, "R1"), 1, n, n);
  Batch<double> G1(Kokkos::view_alloc(Kokkos::WithoutInitializing, "G1"), 1, n, n);
  Batch<double> dX1(Kokkos::view_alloc(Kokkos::WithoutInitializing, "dX1"), 1, n, n);
  EXPECT_KDNN_ERROR(sk::backward(Space(), R1, G1, dX1),
                    "bytes of team scratch per matrix, above the");
  EXPECT_KDNN_ERROR(sk::backward(Space(), R1, G1, dX1), "n=" + std::to_string(n));
  EXPECT_KDNN_ERROR(sk::forward(Space(), R1, dX1), "bytes of team scratch per matrix, above the");
  // The unrolled backward keeps 2n sums per iteration: a huge iteration
  // count is refused the same way.
  Batch<double> X4("X4", 1, 4, 4), G4("G4", 1, 4, 4), dX4("dX4", 1, 4, 4);
  sk::impl::UnrolledBackwardKernel<Space, double> unrolled;
  unrolled.n = 4;
  unrolled.iters = 2;
  while (unrolled.matrix_bytes() <= limit) unrolled.iters *= 2;
  const int iters = unrolled.iters;
  EXPECT_KDNN_ERROR(sk::backward_unrolled(Space(), X4, G4, dX4, {iters}),
                    "sinkhorn::backward_unrolled: n=4 needs");
  // check_backward_unrolled refuses it the same way before anything runs
  // (an autograd forward asks it first), and passes what the backward runs.
  EXPECT_KDNN_ERROR(sk::check_backward_unrolled(Space(), X4, {iters}),
                    "sinkhorn::backward_unrolled: n=4 needs");
  EXPECT_NO_THROW(sk::check_backward_unrolled(Space(), X4, {iters / 2}));
  EXPECT_NO_THROW(sk::backward_unrolled(Space(), X4, G4, dX4, {iters / 2}));
  EXPECT_KDNN_ERROR(sk::check_backward_unrolled(Space(), X4, {10, 1e-6}), "tol=1e-06, expected 0");
  EXPECT_NO_THROW(sk::check_backward_unrolled(Space(), Batch<double>("X0", 0, 4, 4), {iters}));
}

}  // namespace
