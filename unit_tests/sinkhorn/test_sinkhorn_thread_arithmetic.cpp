// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The unrolled backward's thread form (unrolled_backward_thread_kernel.hpp)
// does the lane form's operations (unrolled_backward_gpu_kernel.hpp) in the
// lane form's order, one thread playing the lanes. Both kernels are
// instantiated here, in a file compiled without contraction of a·b + c and
// (GCC) without the straight-line vectoriser, which before GCC 13 may use a
// float before its rounding (unit_tests/CMakeLists.txt): so on a host the
// two must agree bitwise, whatever the machine's vector width. A GPU
// compiler contracts the two kernels differently: there to 2 units in the
// last place of T at the batch's scale. (Compiled with the library's flags,
// the forms differed by 3 units in double after 20 iterations on an
// AVX-512 host.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kdnn/core/impl/backend_traits.hpp"
#include "kdnn/sinkhorn/impl/sinkhorn_impl.hpp"
#include "random.hpp"
#include "sinkhorn_test_util.hpp"

namespace {

using namespace kdnn_test;
namespace sk = kdnn::sinkhorn;

constexpr bool kHost = kdnn::impl::BackendTraits<Space>::is_host;

template <class T>
class SinkhornThreadArithmetic : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(SinkhornThreadArithmetic, Types);

/// dX of the unrolled backward by kernel K (the thread or the lane form at
/// n = N), run directly.
template <class K, class T, int N>
std::vector<double> run_kernel(const std::vector<double>& x, const std::vector<double>& g,
                               int batch, const sk::ForwardOptions& o) {
  K k;
  k.X = batch_of<T>(x, batch, N);
  k.G = batch_of<T>(g, batch, N);
  Batch<T> dX("dX", batch, N, N);
  k.dX = dX;
  k.iters = o.iters;
  k.eps = o.eps;
  k.batch = batch;
  k.transpose = o.order == sk::Order::rows_first;
  if (batch > 0) k.run("test", Space(), o.launch);
  return to_host(dX);
}

template <class T, int N>
void expect_thread_form_is_lane_form() {
  unsigned seed = 1300 + N;
  for (int batch : {0, 1, 37}) {
    const auto x = uniform(std::size_t(batch) * N * N, -2.0, 2.0, seed++);
    const auto g = uniform(std::size_t(batch) * N * N, -1.0, 1.0, seed++);
    for (int iters : {1, 2, 20}) {
      for (auto order : {sk::Order::columns_first, sk::Order::rows_first}) {
        for (double eps : {0.0, 0.01}) {
          for (int tile : {0, 3}) {  // 0: the form's own (a warp's matrices on a GPU)
            SCOPED_TRACE("n=" + std::to_string(N) + " batch=" + std::to_string(batch) +
                         " iters=" + std::to_string(iters) +
                         " rows_first=" + std::to_string(order == sk::Order::rows_first) +
                         " eps=" + std::to_string(eps) + " tile=" + std::to_string(tile));
            sk::ForwardOptions o{iters, 0.0, order, eps};
            o.launch.tile = tile;
            const auto thread =
                run_kernel<sk::impl::UnrolledBackwardThreadKernel<Space, T, N>, T, N>(x, g, batch,
                                                                                      o);
            o.launch.tile = 0;  // the lane form's own
            const auto lane =
                run_kernel<sk::impl::UnrolledBackwardGpuKernel<Space, T, N>, T, N>(x, g, batch, o);
            ASSERT_EQ(thread.size(), lane.size());
            if (kHost) {
              EXPECT_TRUE(thread.empty() || std::memcmp(thread.data(), lane.data(),
                                                        thread.size() * sizeof(double)) == 0);
            } else {
              double scale = 0, diff = 0;
              for (std::size_t k = 0; k < lane.size(); ++k) {
                scale = std::fmax(scale, std::fabs(lane[k]));
                diff = std::fmax(diff, std::fabs(thread[k] - lane[k]));
              }
              EXPECT_LE(diff, 2 * std::numeric_limits<T>::epsilon() * scale);
            }
          }
        }
      }
    }
  }
}

TYPED_TEST(SinkhornThreadArithmetic, UnrolledThreadFormIsTheLaneFormsArithmetic) {
  expect_thread_form_is_lane_form<TypeParam, 2>();
  expect_thread_form_is_lane_form<TypeParam, 4>();
}

}  // namespace
