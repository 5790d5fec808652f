// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The causal conv1d on channel-first tensors (causal-conv1d's contiguous
// [B, C, L], with padded rows, seen as [B, L, C] through its strides): in
// both forms (the host's tiles, the GPU's register windows) and for a width
// only the tiles take, forward and backward equal those of channel-last
// contiguous copies, without reading or writing the memory between the
// elements; an output whose elements overlap is refused.
#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <limits>
#include <vector>

#include "allclose.hpp"
#include "contraction.hpp"
#include "conv_reference.hpp"
#include "expect_error.hpp"
#include "kdnn/ssm/causal_conv1d.hpp"
#include "random.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;
using ssm_ref::ConvShape;
namespace ssm = kdnn::ssm;

template <class T>
using Strided = kdnn::StridedTensor3<T, Space>;

/// [B, C, n + pad] storage seen as [B, n, C]: element (b, s, c) at
/// (b·C + c)·(n + pad) + s.
struct ChannelFirst {
  std::size_t B, n, C, pad;
  std::size_t row() const { return n + pad; }
  std::size_t size() const { return B * C * row(); }
  std::size_t at(std::size_t b, std::size_t s, std::size_t c) const {
    return (b * C + c) * row() + s;
  }
  template <class T>
  Strided<T> view(T* data) const {
    return Strided<T>(data, Kokkos::LayoutStride(B, C * row(), n, 1, C, row()));
  }
  /// Storage holding `values` ([B, n, C] order) at the elements and `fill`
  /// between them.
  std::vector<double> store(const std::vector<double>& values, double fill) const {
    std::vector<double> x(size(), fill);
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t s = 0; s < n; ++s)
        for (std::size_t c = 0; c < C; ++c) x[at(b, s, c)] = values[(b * n + s) * C + c];
    return x;
  }
  /// The elements of `storage` in [B, n, C] order, and whether every value
  /// between them is still `fill`.
  std::vector<double> gather(const std::vector<double>& storage, double fill, bool& kept) const {
    std::vector<double> x;
    std::vector<bool> element(size(), false);
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t s = 0; s < n; ++s)
        for (std::size_t c = 0; c < C; ++c) {
          x.push_back(storage[at(b, s, c)]);
          element[at(b, s, c)] = true;
        }
    kept = true;
    for (std::size_t i = 0; i < storage.size(); ++i) kept &= element[i] || storage[i] == fill;
    return x;
  }
};

/// Forward and backward outputs, [B, ·, C] order: y, final, dx, dinit, dw, dbias.
using Outputs = std::array<std::vector<double>, 6>;

template <class T>
class CausalConv1dStrides : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(CausalConv1dStrides, Types);

TYPED_TEST(CausalConv1dStrides, ChannelFirstTensorsEqualChannelLastCopies) {
  using T = TypeParam;
  const double exact = host_contracts() ? 8 * std::numeric_limits<T>::epsilon() : 0;
  const double nan = std::numeric_limits<double>::quiet_NaN(), sentinel = 7.0;
  unsigned seed = 300;
  for (const ConvShape& s : {ConvShape{2, 37, 5, 4}, ConvShape{2, 70, 300, 2},
                             ConvShape{1, 130, 65, 7}, ConvShape{2, 2, 3, 4}}) {
    const std::size_t B = s.B, L = s.L, C = s.C, K1 = s.K - 1;
    const std::vector<double> x = normal(B * L * C, seed), w = normal(C * s.K, seed + 1),
                              bias = normal(C, seed + 2), init = normal(B * K1 * C, seed + 3),
                              dy = normal(B * L * C, seed + 4), dfin = normal(B * K1 * C, seed + 5);
    seed += 10;
    const auto wv = to_device<T**>(w, C, s.K);
    const auto bv = to_device<T*>(bias, C);
    for (const auto form : {kdnn::KernelForm::host, kdnn::KernelForm::gpu}) {
      for (const bool silu : {true, false}) {
        SCOPED_TRACE(::testing::Message() << "L=" << L << " C=" << C << " K=" << s.K << " form "
                                          << int(form) << " silu=" << silu);
        ssm::CausalConv1dOptions opts;
        opts.silu = silu;
        opts.launch.form = form;

        // Channel-last contiguous copies.
        Outputs want;
        {
          const auto xv = to_device<T***>(x, B, L, C), iv = to_device<T***>(init, B, K1, C),
                     gv = to_device<T***>(dy, B, L, C), fv = to_device<T***>(dfin, B, K1, C);
          DeviceView<T***> y("y", B, L, C), fin("final", B, K1, C), dx("dx", B, L, C),
              dinit("dinit", B, K1, C);
          DeviceView<T**> dw("dw", C, s.K);
          DeviceView<T*> dbias("dbias", C);
          ssm::causal_conv1d_forward(Space(), ssm::ConvForward<T, Space>{xv, wv, bv, iv, y, fin},
                                     opts);
          ssm::causal_conv1d_backward(
              Space(), ssm::ConvBackward<T, Space>{xv, wv, bv, iv, gv, fv, dx, dw, dbias, dinit},
              opts);
          want = {to_host(y),     to_host(fin), to_host(dx),
                  to_host(dinit), to_host(dw),  to_host(dbias)};
        }

        // Channel-first, with NaN between the inputs' elements and a
        // sentinel between the outputs'.
        const ChannelFirst steps{B, L, C, 3}, states{B, K1, C, 2};
        const auto xs = to_device<T*>(steps.store(x, nan), steps.size()),
                   gs = to_device<T*>(steps.store(dy, nan), steps.size()),
                   is = to_device<T*>(states.store(init, nan), states.size()),
                   fs = to_device<T*>(states.store(dfin, nan), states.size());
        const auto out = [](const ChannelFirst& l) {
          return to_device<T*>(std::vector<double>(l.size(), 7.0), l.size());
        };
        const auto ys = out(steps), dxs = out(steps), fins = out(states), dinits = out(states);
        DeviceView<T**> dw("dw", C, s.K);
        DeviceView<T*> dbias("dbias", C);
        const Strided<const T> xv = steps.view<const T>(xs.data()),
                               gv = steps.view<const T>(gs.data()),
                               iv = states.view<const T>(is.data()),
                               fv = states.view<const T>(fs.data());
        ssm::causal_conv1d_forward(
            Space(),
            ssm::ConvForward<T, Space>{xv, wv, bv, iv, steps.view<T>(ys.data()),
                                       states.view<T>(fins.data())},
            opts);
        ssm::causal_conv1d_backward(
            Space(),
            ssm::ConvBackward<T, Space>{xv, wv, bv, iv, gv, fv, steps.view<T>(dxs.data()), dw,
                                        dbias, states.view<T>(dinits.data())},
            opts);
        bool kept[4];
        const Outputs got = {steps.gather(to_host(ys), sentinel, kept[0]),
                             states.gather(to_host(fins), sentinel, kept[1]),
                             steps.gather(to_host(dxs), sentinel, kept[2]),
                             states.gather(to_host(dinits), sentinel, kept[3]),
                             to_host(dw),
                             to_host(dbias)};
        const char* names[] = {"y", "final_state", "dx", "dinitial_state", "dw", "dbias"};
        for (int i = 0; i < 6; ++i) {
          EXPECT_ALLCLOSE(got[i], want[i], exact, exact) << names[i];
          if (i < 4) {
            EXPECT_TRUE(kept[i]) << names[i] << ": values between the elements written";
          }
        }
      }
    }
  }
}

// An output whose elements overlap (a stride 0) is a kdnn::Error naming it.
TEST(CausalConv1dStridesErrors, OverlappingOutputsAreRefused) {
  using T = double;
  const std::size_t B = 1, L = 6, C = 3, K = 2;
  DeviceView<T***> x("x", B, L, C), dy("dy", B, L, C), dx("dx", B, L, C);
  DeviceView<T**> w("w", C, K), dw("dw", C, K);
  DeviceView<T*> row("row", L);
  // Every channel of y on the same memory.
  const Strided<T> shared(row.data(), Kokkos::LayoutStride(B, L, L, 1, C, 0));
  EXPECT_KDNN_ERROR(
      ssm::causal_conv1d_forward(Space(), ssm::ConvForward<T, Space>{x, w, {}, {}, shared, {}}),
      "y has stride(2)=0 with extent(2)=3, expected an output whose elements do not overlap");
  EXPECT_KDNN_ERROR(
      ssm::causal_conv1d_backward(
          Space(), ssm::ConvBackward<T, Space>{x, w, {}, {}, dy, {}, shared, dw, {}, {}}),
      "dx has stride(2)=0 with extent(2)=3, expected an output whose elements do not overlap");
  // An input of stride 0 (a broadcast) is read as it is.
  DeviceView<T***> y("y", B, L, C);
  const Strided<const T> broadcast(row.data(), Kokkos::LayoutStride(B, L, L, 1, C, 0));
  EXPECT_NO_THROW(
      ssm::causal_conv1d_forward(Space(), ssm::ConvForward<T, Space>{broadcast, w, {}, {}, y, {}}));
}

}  // namespace
