// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The GPU form of the Sinkhorn operators (launch.form = KernelForm::gpu: the
// thread forms for n <= 4, forward_thread_kernel.hpp,
// cg_backward_thread_kernel.hpp and unrolled_backward_thread_kernel.hpp, the
// lane forms forward_gpu_kernel.hpp,
// cg_backward_gpu_kernel.hpp, unrolled_backward_gpu_kernel.hpp) against the
// host form, on whatever backend the tests run on (on a host, the GPU form
// runs as plain loops).
//
// What is bitwise and what is to rounding: the two forms do the same
// floating-point operations in the same order (the first iteration in double
// through the same functions, every later sum in index order, the same
// rescaling and marginal error), so on a host backend, whose build does not
// contract a·b + c into an FMA, R, the iteration counts and the marginal
// errors are bitwise identical, and that is what is asserted. On a GPU the
// compiler may contract the two kernels' sums differently, so R and the
// marginal errors are asserted to a few units in the last place of T there;
// the iteration counts still must match.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "all_sizes.hpp"
#include "contraction.hpp"
#include "kdnn/core/impl/backend_traits.hpp"
#include "kdnn/sinkhorn/impl/sinkhorn_impl.hpp"
#include "random.hpp"
#include "sinkhorn_test_util.hpp"

namespace {

using namespace kdnn_test;
namespace sk = kdnn::sinkhorn;

constexpr bool kHost = kdnn::impl::BackendTraits<Space>::is_host;
/// The two forms compute the same sums in the same order: bitwise equal on
/// a host whose compiler does not contract a·b + c (contraction.hpp).
const bool kBitwise = kHost && !kdnn_test::host_contracts();

template <class T>
class SinkhornGpuForm : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(SinkhornGpuForm, Types);

struct Outcome {
  std::vector<double> R, iterations, marginal_error;
};

template <class T>
Outcome run(const std::vector<double>& x, int batch, int n, sk::ForwardOptions o,
            kdnn::KernelForm form) {
  o.launch.form = form;
  auto X = batch_of<T>(x, batch, n);
  Batch<T> R("R", batch, n, n);
  const auto report = Report::allocate(batch);
  sk::forward(Space(), X, R, o, report);
  return {to_host(R), to_host(report.iterations), to_host(report.marginal_error)};
}

/// Bitwise equal (NaN equal to NaN).
bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}

/// Equal to `ulps` units in the last place of T, relative to the larger.
template <class T>
::testing::AssertionResult within_ulps(const std::vector<double>& a, const std::vector<double>& b,
                                       double ulps) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes differ";
  const double unit = std::numeric_limits<T>::epsilon();
  for (std::size_t k = 0; k < a.size(); ++k) {
    if (std::isnan(a[k]) && std::isnan(b[k])) continue;
    const double scale = std::fmax(std::fabs(a[k]), std::fabs(b[k]));
    if (!(std::fabs(a[k] - b[k]) <= ulps * unit * scale)) {
      return ::testing::AssertionFailure() << "element " << k << ": " << a[k] << " vs " << b[k];
    }
  }
  return ::testing::AssertionSuccess();
}

template <class T>
void expect_same(const Outcome& gpu, const Outcome& host) {
  EXPECT_EQ(gpu.iterations, host.iterations);
  if (kBitwise) {
    EXPECT_TRUE(same_bits(gpu.R, host.R));
    EXPECT_TRUE(same_bits(gpu.marginal_error, host.marginal_error));
  } else {
    EXPECT_TRUE(within_ulps<T>(gpu.R, host.R, 8));
    // The errors are differences from 1 of sums near 1: a few ulps of 1.
    const double unit = std::numeric_limits<T>::epsilon();
    for (std::size_t b = 0; b < host.marginal_error.size(); ++b) {
      EXPECT_NEAR(gpu.marginal_error[b], host.marginal_error[b], 8 * unit) << "b=" << b;
    }
  }
}

TYPED_TEST(SinkhornGpuForm, MatchesHostForm) {
  using T = TypeParam;
  unsigned seed = 1;
  for (int n : {1, 2, 3, 4, 8, 16, 32}) {
    for (int batch : {0, 1, 5, 37}) {
      const auto x = uniform(std::size_t(batch) * n * n, -3.0, 3.0, seed++);
      for (auto order : {sk::Order::columns_first, sk::Order::rows_first}) {
        for (double eps : {0.0, 0.01}) {
          for (double tol : {0.0, 1e-4}) {
            sk::ForwardOptions o{20, tol, order, eps};
            SCOPED_TRACE("n=" + std::to_string(n) + " batch=" + std::to_string(batch) +
                         " rows_first=" + std::to_string(order == sk::Order::rows_first) +
                         " eps=" + std::to_string(eps) + " tol=" + std::to_string(tol));
            expect_same<T>(run<T>(x, batch, n, o, kdnn::KernelForm::gpu),
                           run<T>(x, batch, n, o, kdnn::KernelForm::host));
          }
        }
      }
    }
  }
}

// Partial −inf masks (a masked entry in most rows, no row or column fully
// masked) and huge entries, ±1e30 (finite in float), which send rows through
// the first iteration's log-domain path.
TYPED_TEST(SinkhornGpuForm, MasksAndHugeValuesMatchHostForm) {
  using T = TypeParam;
  const double inf = std::numeric_limits<double>::infinity();
  for (int n : {2, 3, 4, 8, 16, 32}) {
    const int batch = 6;
    auto x = uniform(std::size_t(batch) * n * n, -2.0, 2.0, 100 + n);
    for (int b = 0; b < batch; ++b) {
      for (int i = 0; i < n; ++i) {
        double* row = &x[(std::size_t(b) * n + i) * n];
        if (b % 2 == 0 && i + 1 < n) row[(i + 1) % n] = -inf;  // partial mask
        if (b % 3 == 1) row[(i * 7 + b) % n] = i % 2 ? 1e30 : -1e30;
      }
    }
    for (auto order : {sk::Order::columns_first, sk::Order::rows_first}) {
      for (double eps : {0.0, 0.01}) {
        sk::ForwardOptions o{15, 0.0, order, eps};
        SCOPED_TRACE("n=" + std::to_string(n) + " eps=" + std::to_string(eps));
        const Outcome host = run<T>(x, batch, n, o, kdnn::KernelForm::host);
        for (double v : host.R) ASSERT_TRUE(std::isfinite(v));
        expect_same<T>(run<T>(x, batch, n, o, kdnn::KernelForm::gpu), host);
      }
    }
  }
}

// The lane forms run for n in {8, 16, 32} only, with that n compiled (n <= 4
// takes the thread forms); other n (and the automatic form on a host) take
// the generic kernels, still correct.
TYPED_TEST(SinkhornGpuForm, DispatchesOnlyTheCompiledSizes) {
  KDNN_TEST_NEEDS_ALL_SIZES();
  using T = TypeParam;
  for (int n : {1, 2, 3, 4, 5, 8, 16, 31, 32}) {
    const int batch = 3, iters = 20;
    const auto x = uniform(std::size_t(batch) * n * n, 0.0, 4.0, 7 + n);
    auto X = batch_of<T>(x, batch, n);
    Batch<T> R("R", batch, n, n);
    sk::ForwardOptions o{iters};
    o.launch.form = kdnn::KernelForm::gpu;
    const auto gpu_ran = [&] {  // the dispatch every operator's GPU form goes through
      int lanes = 0;            // the n the lane form ran with
      sk::impl::run_matrix_form(
          "op", Space(), o.launch, n, [](auto) {},
          [&](auto size) {
            lanes = decltype(size)::value;
            return true;
          });
      EXPECT_TRUE(lanes == 0 || lanes == n) << lanes;
      return lanes == n;
    };
    const bool compiled = n == 8 || n == 16 || n == 32;
    EXPECT_EQ(gpu_ran(), compiled) << "n=" << n;
    o.launch.form = kdnn::KernelForm::automatic;
    EXPECT_EQ(gpu_ran(), compiled && !kHost) << "n=" << n;
    o.launch.form = kdnn::KernelForm::gpu;
    sk::forward(Space(), X, R, o);
    expect_plain_formula(to_host(R), x, batch, n, iters, tol<T>(1e-13, 2e-6));
  }
}

// The thread forms (one thread per matrix) run for n in 1 … 4 only, where a
// GPU form is asked for (or chosen on a GPU); MatchesHostForm,
// MasksAndHugeValuesMatchHostForm and BackwardMatchesHostForm check what
// they compute.
TEST(SinkhornGpuForm, ThreadFormRunsForTheSmallSizes) {
  KDNN_TEST_NEEDS_ALL_SIZES();
  for (int n : {1, 2, 3, 4, 5, 8}) {
    for (auto form : {kdnn::KernelForm::gpu, kdnn::KernelForm::automatic, kdnn::KernelForm::host}) {
      kdnn::Launch launch;
      launch.form = form;
      int ran = 0;
      const bool said = sk::impl::run_matrix_form(
          "op", Space(), launch, n, [&](auto size) { ran = decltype(size)::value; },
          [](auto) { return false; });
      const bool gpu =
          form == kdnn::KernelForm::gpu || (form == kdnn::KernelForm::automatic && !kHost);
      EXPECT_EQ(said, gpu && n <= 4) << "n=" << n << " form=" << int(form);
      EXPECT_EQ(ran, said ? n : 0);
    }
  }
  kdnn::Launch bad;
  bad.form = kdnn::KernelForm::gpu;
  bad.team_size = -1;
  EXPECT_KDNN_ERROR(sk::impl::run_matrix_form(
                        "op", Space(), bad, 4, [](auto) {}, [](auto) { return false; }),
                    "launch.team_size=-1, expected >= 0");
  // Checked as the other forms check them, though the thread form uses
  // neither: a request is valid or not whichever form runs (on a GPU the
  // automatic form is this one at n <= 4, on a host the host form).
  bad.team_size = 100000;
  EXPECT_KDNN_ERROR(sk::impl::run_matrix_form(
                        "op", Space(), bad, 4, [](auto) {}, [](auto) { return false; }),
                    "launch.team_size=100000, expected at most");
  bad.team_size = 0;
  bad.vector_length = 3;
  EXPECT_KDNN_ERROR(sk::impl::run_matrix_form(
                        "op", Space(), bad, 4, [](auto) {}, [](auto) { return false; }),
                    "launch.vector_length=3, expected a power of two");
}

struct BackwardOutcome {
  std::vector<double> dX, iterations, marginal_error, residual;
};

template <class T>
BackwardOutcome run_backward(const Batch<T>& R, const std::vector<double>& g, sk::BackwardOptions o,
                             kdnn::KernelForm form) {
  const int batch = int(R.extent(0)), n = int(R.extent(1));
  o.launch.form = form;
  const auto G = batch_of<T>(g, batch, n);
  Batch<T> dX("dX", batch, n, n);
  const auto report = Report::allocate(batch);
  sk::backward(Space(), R, G, dX, o, report);
  return {to_host(dX), to_host(report.iterations), to_host(report.marginal_error),
          to_host(report.residual)};
}

// The implicit and block backwards' GPU forms against the host forms. The
// thread form (cg_backward_thread_kernel.hpp, n <= 4) computes the same
// operations in the same order: bitwise on a host; on a GPU, where the
// compiler may contract the two differently and CG amplifies that by the
// system's conditioning, to the solver's tolerance. The lane form
// (cg_backward_gpu_kernel.hpp, n >= 8) sums CG's dot products by butterfly
// among its lanes: to the solver's tolerance everywhere.
TYPED_TEST(SinkhornGpuForm, BackwardMatchesHostForm) {
  using T = TypeParam;
  unsigned seed = 500;
  for (int n : {1, 2, 3, 4, 8, 16, 32}) {
    for (int batch : {0, 1, 5, 37}) {
      const auto x = uniform(std::size_t(batch) * n * n, -2.0, 2.0, seed++);
      const auto g = uniform(std::size_t(batch) * n * n, -1.0, 1.0, seed++);
      auto X = batch_of<T>(x, batch, n);
      Batch<T> R("R", batch, n, n);
      sk::forward(Space(), X, R, sk::ForwardOptions{6});  // not yet balanced
      for (auto method : {sk::Method::implicit, sk::Method::block}) {
        for (auto marginals : {sk::Marginals::measured, sk::Marginals::unit}) {
          sk::BackwardOptions o;
          o.method = method;
          o.marginals = marginals;
          SCOPED_TRACE("n=" + std::to_string(n) + " batch=" + std::to_string(batch) +
                       " block=" + std::to_string(method == sk::Method::block) +
                       " unit=" + std::to_string(marginals == sk::Marginals::unit));
          const auto gpu = run_backward<T>(R, g, o, kdnn::KernelForm::gpu);
          const auto host = run_backward<T>(R, g, o, kdnn::KernelForm::host);
          if (kBitwise && n <= 4) {
            EXPECT_TRUE(same_bits(gpu.dX, host.dX));
            EXPECT_EQ(gpu.iterations, host.iterations);
            EXPECT_TRUE(same_bits(gpu.marginal_error, host.marginal_error));
            EXPECT_TRUE(same_bits(gpu.residual, host.residual));
          } else if (marginals == sk::Marginals::measured) {  // consistent systems only
            double scale = 0, diff = 0;
            for (std::size_t k = 0; k < host.dX.size(); ++k) {
              scale = std::fmax(scale, std::fabs(host.dX[k]));
              diff = std::fmax(diff, std::fabs(gpu.dX[k] - host.dX[k]));
            }
            EXPECT_LE(diff, tol<T>(1e-9, 1e-3) * std::fmax(scale, 1.0));
          }
          if (kBitwise && n > 4) {  // the lane form's marginals: the same sums, before CG
            EXPECT_TRUE(same_bits(gpu.marginal_error, host.marginal_error));
          }
        }
      }
    }
  }
}

// The GPU form picks its own vector length and tile; a team size beyond the
// backend's limit is still a kdnn::Error, and so is a vector length that no
// launch could take; valid requests change nothing.
TEST(SinkhornGpuForm, LaunchRequests) {
  const int n = 8, batch = 9;
  const auto x = uniform(std::size_t(batch) * n * n, 0.0, 4.0, 3);
  sk::ForwardOptions o{10};
  const Outcome ref = run<double>(x, batch, n, o, kdnn::KernelForm::gpu);
  o.launch.team_size = 1;
  o.launch.vector_length = 4;
  o.launch.tile = 3;
  const Outcome got = run<double>(x, batch, n, o, kdnn::KernelForm::gpu);
  EXPECT_TRUE(same_bits(got.R, ref.R));
  o.launch.team_size = 100000;
  EXPECT_KDNN_ERROR(run<double>(x, batch, n, o, kdnn::KernelForm::gpu),
                    "launch.team_size=100000, expected at most");
  o.launch.team_size = -1;
  EXPECT_KDNN_ERROR(run<double>(x, batch, n, o, kdnn::KernelForm::gpu),
                    "launch.team_size=-1, expected >= 0");
  o.launch.team_size = 0;
  o.launch.vector_length = 3;
  EXPECT_KDNN_ERROR(run<double>(x, batch, n, o, kdnn::KernelForm::gpu),
                    "launch.vector_length=3, expected a power of two");
  sk::BackwardOptions b;
  b.launch.vector_length = 3;
  b.launch.form = kdnn::KernelForm::gpu;
  Batch<double> R("R", batch, n, n), G("G", batch, n, n), dX("dX", batch, n, n);
  EXPECT_KDNN_ERROR(sk::backward(Space(), R, G, dX, b),
                    "launch.vector_length=3, expected a power of two");
  o.launch.form = kdnn::KernelForm::gpu;
  EXPECT_KDNN_ERROR(sk::backward_unrolled(Space(), R, G, dX, o),
                    "launch.vector_length=3, expected a power of two");
}

template <class T>
std::vector<double> run_unrolled(const std::vector<double>& x, const std::vector<double>& g,
                                 int batch, int n, sk::ForwardOptions o, kdnn::KernelForm form) {
  o.launch.form = form;
  Batch<T> dX("dX", batch, n, n);
  sk::backward_unrolled(Space(), batch_of<T>(x, batch, n), batch_of<T>(g, batch, n), dX, o);
  return to_host(dX);
}

// The unrolled backward's GPU form (unrolled_backward_gpu_kernel.hpp) against
// the reverse-mode reference and the host form. The GPU form sums dP's
// rank-1 terms in double in the reverse sweep's order, the host form in T in
// the forward order, so the two agree to their accuracy, not bitwise (except
// with one iteration, which has no such terms: bitwise on a host). Asserted
// per batch: the error against the reference within a bound, and within 3×
// the host form's error (flash attention's rule for a kernel that reorders a
// reference's sums; measured here: at most 1.5× in float, 1.2× in double).
TYPED_TEST(SinkhornGpuForm, UnrolledBackwardMatchesReferenceAndHostForm) {
  using T = TypeParam;
  const double unit = std::numeric_limits<T>::epsilon();
  unsigned seed = 900;
  for (int n : {1, 2, 3, 4, 8, 16, 32}) {
    for (int batch : {0, 1, 5, 37}) {
      const auto x = uniform(std::size_t(batch) * n * n, -2.0, 2.0, seed++);
      const auto g = uniform(std::size_t(batch) * n * n, -1.0, 1.0, seed++);
      for (int iters : {1, 2, 20}) {
        for (auto order : {sk::Order::columns_first, sk::Order::rows_first}) {
          for (double eps : {0.0, 0.01}) {
            SCOPED_TRACE("n=" + std::to_string(n) + " batch=" + std::to_string(batch) +
                         " iters=" + std::to_string(iters) +
                         " rows_first=" + std::to_string(order == sk::Order::rows_first) +
                         " eps=" + std::to_string(eps));
            const sk::ForwardOptions o{iters, 0.0, order, eps};
            const auto gpu = run_unrolled<T>(x, g, batch, n, o, kdnn::KernelForm::gpu);
            const auto host = run_unrolled<T>(x, g, batch, n, o, kdnn::KernelForm::host);
            if (iters == 1 && kBitwise) {
              EXPECT_TRUE(same_bits(gpu, host));
            }
            if (n == 1) {
              // R does not depend on X: dX = 0, computed as the difference
              // of two equal terms (P − w)(dP − a) − S·b, each at most
              // max|G| in size. Exactly 0 when both products are rounded;
              // a compiler that fuses one of them into an FMA (CUDA's
              // does) leaves that product's rounding error.
              double g_max = 0;
              for (double e : g) g_max = std::max(g_max, std::abs(e));
              for (double v : gpu) EXPECT_LE(std::abs(v), unit * g_max);
              continue;
            }
            const Variant v{order == sk::Order::rows_first, eps};
            std::vector<double> ref;
            for (int b = 0; b < batch; ++b) {
              const Mat m = ref_unrolled_backward(matrix(x, b, n), matrix(g, b, n), n, iters, v);
              ref.insert(ref.end(), m.begin(), m.end());
            }
            const double gpu_error = rel_error(gpu, ref), host_error = rel_error(host, ref);
            EXPECT_LT(gpu_error, tol<T>(1e-13, 2e-6));
            // No less accurate than the host form, up to what the float64
            // reference can tell: its own rounding over `iters` iterations
            // (in double, a host form that happens to land within 0.4 ulp
            // of it left no room for the GPU form's 2.4 ulp at n = 2).
            const double reference_floor = iters * std::numeric_limits<double>::epsilon();
            EXPECT_LE(gpu_error, 3 * host_error + unit + reference_floor)
                << "host form's error " << host_error;
          }
        }
      }
    }
  }
}

// The GPU form keeps every iteration's scaling vectors on-chip; past that
// (here 2 × 400 × 32 doubles) the host form runs, with its results.
TEST(SinkhornGpuForm, UnrolledBackwardHistoryPastOnChipRunsTheHostForm) {
  const int n = 32, batch = 3;
  sk::impl::UnrolledBackwardGpuKernel<Space, double, 32> k;
  k.iters = 20;
  EXPECT_TRUE(k.fits_on_chip());
  k.iters = 400;
  EXPECT_FALSE(k.fits_on_chip());
  const auto x = uniform(std::size_t(batch) * n * n, -2.0, 2.0, 41);
  const auto g = uniform(std::size_t(batch) * n * n, -1.0, 1.0, 42);
  const sk::ForwardOptions o{400};
  EXPECT_TRUE(same_bits(run_unrolled<double>(x, g, batch, n, o, kdnn::KernelForm::gpu),
                        run_unrolled<double>(x, g, batch, n, o, kdnn::KernelForm::host)));
}

// The thread form keeps the history in team scratch, interleaved across a
// team's matrices: on-chip, or past it (here 2 × 600 × 4 doubles per matrix,
// 38 KB, above a host's 32 KB on-chip level) in a GPU launch's bounded team
// workspace, whose teams stride over the tiles. Both against the host form
// (which sums dP's terms in another order: to its accuracy) and with several
// matrices per team, bitwise the same as one per team.
TEST(SinkhornGpuForm, UnrolledThreadFormPastOnChipUsesTheWorkspace) {
  const int n = 4, batch = 37;
  const auto x = uniform(std::size_t(batch) * n * n, -2.0, 2.0, 51);
  const auto g = uniform(std::size_t(batch) * n * n, -1.0, 1.0, 52);
  for (int iters : {20, 600}) {
    SCOPED_TRACE("iters=" + std::to_string(iters));
    sk::ForwardOptions o{iters, 0.0, sk::Order::rows_first, 0.01};
    const auto host = run_unrolled<double>(x, g, batch, n, o, kdnn::KernelForm::host);
    o.launch.tile = 1;
    const auto one = run_unrolled<double>(x, g, batch, n, o, kdnn::KernelForm::gpu);
    o.launch.tile = 5;
    const auto five = run_unrolled<double>(x, g, batch, n, o, kdnn::KernelForm::gpu);
    EXPECT_TRUE(same_bits(one, five));
    EXPECT_LT(rel_error(one, host), 1e-12);
    EXPECT_NE(one, std::vector<double>(one.size(), 0.0));
  }
}

/// Forward R and the implicit, block and unrolled dX of one batch, every
/// operator launched with `form`.
std::vector<std::vector<double>> all_operators(const std::vector<double>& x,
                                               const std::vector<double>& g, int batch, int n,
                                               kdnn::KernelForm form) {
  using T = double;
  sk::ForwardOptions fo{20, 0.0, sk::Order::columns_first, 0.01};
  fo.launch.form = form;
  const auto X = batch_of<T>(x, batch, n);
  const auto G = batch_of<T>(g, batch, n);
  Batch<T> R("R", batch, n, n), implicit("implicit", batch, n, n), block("block", batch, n, n),
      unrolled("unrolled", batch, n, n);
  sk::forward(Space(), X, R, fo);
  sk::BackwardOptions bo;
  bo.launch.form = form;
  sk::backward(Space(), R, G, implicit, bo);
  bo.method = sk::Method::block;
  sk::backward(Space(), R, G, block, bo);
  sk::backward_unrolled(Space(), X, G, unrolled, fo);
  return {to_host(R), to_host(implicit), to_host(block), to_host(unrolled)};
}

// n = 64 in double: one matrix's scratch (64 × 65 doubles, 33 KB, and more)
// is past a host's on-chip level (32 KB), so a GPU launch (forced here) runs
// the generic kernels over a bounded league in a team workspace
// (core/impl/team_work.hpp) while the host launch takes level 1. The same
// kernels on the same matrices: bitwise the same results.
TEST(SinkhornGpuLaunch, PastLevelZeroEveryOperatorMatchesTheHostLaunch) {
  const int n = 64;
  for (int batch : {1, 7}) {
    SCOPED_TRACE("batch=" + std::to_string(batch));
    const auto x = uniform(std::size_t(batch) * n * n, -2.0, 2.0, 71 + batch);
    const auto g = uniform(std::size_t(batch) * n * n, -1.0, 1.0, 81 + batch);
    const auto gpu = all_operators(x, g, batch, n, kdnn::KernelForm::gpu);
    const auto host = all_operators(x, g, batch, n, kdnn::KernelForm::host);
    for (std::size_t k = 0; k < gpu.size(); ++k) {
      EXPECT_TRUE(same_bits(gpu[k], host[k])) << "operator " << k;
      EXPECT_NE(gpu[k], std::vector<double>(gpu[k].size(), 0.0)) << "operator " << k;
    }
  }
}

}  // namespace
