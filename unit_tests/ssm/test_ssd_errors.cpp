// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The chunked SSD's checks of its arguments: check_dt refuses a negative
// step and check_finite a NaN or an infinity, each naming the first; bad
// extents, groups, D, states, overlapping outputs and A > 0 (when asked
// for) are errors naming the argument.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "expect_error.hpp"
#include "kdnn/ssm/ssd.hpp"
#include "ssd_reference.hpp"
#include "ssd_test_problems.hpp"
#include "ssd_views.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;
using ssm_ref::SsdCase;
using ssm_ref::SsdShape;
namespace ssm = kdnn::ssm;

// check_dt refuses a negative step; a NaN or an infinity is check_finite's
// (without it, it propagates, as in PyTorch).
TEST(SsdErrors, CheckDtRefusesNegativeStepsAndCheckFiniteNonFiniteOnes) {
  using T = double;
  const SsdShape s{2, 10, 4, 3, 2, 2};
  const SsdCase a = make_case(s, kAll, 5);
  SsdViews<T> v(a);
  DeviceView<T****> y("y", s.B, s.L, s.H, s.P);
  ssm::SsdForward<T, Space> f;
  v.set_inputs(f);
  f.y = y;
  ssm::SsdOptions opts;
  opts.check_dt = true;
  EXPECT_NO_THROW(ssm::ssd_forward(Space(), f, opts));
  for (const double bad : {-0.5, double(NAN), double(INFINITY)}) {
    auto dt = a.dt;
    dt[(1 * s.L + 7) * s.H + 2] = bad;  // [1, 7, 2]
    dt[(1 * s.L + 8) * s.H + 0] = -1;   // a later one
    f.dt = to_device<T***>(dt, s.B, s.L, s.H);
    const std::string first = bad < 0 ? "dt[1, 7, 2]=-0.5" : "dt[1, 8, 0]=-1";
    EXPECT_KDNN_ERROR(ssm::ssd_forward(Space(), f, opts), first + ", expected dt >= 0 (check_dt)");
    ssm::SsdOptions finite;
    finite.check_finite = true;
    if (bad < 0) {
      EXPECT_NO_THROW(ssm::ssd_forward(Space(), f, finite));  // finite, if negative
    } else {
      EXPECT_KDNN_ERROR(ssm::ssd_forward(Space(), f, finite),
                        std::string("dt[1, 7, 2]=") + (bad > 0 ? "inf" : "nan") +
                            ", expected finite values (check_finite)");
    }
    EXPECT_NO_THROW(ssm::ssd_forward(Space(), f, ssm::SsdOptions()));  // not checked unless asked
  }
}

TEST(SsdErrors, BadArgumentsAreNamed) {
  using T = double;
  const SsdShape s{1, 10, 4, 3, 2, 2};
  const SsdCase a = make_case(s, kAll, 5);
  SsdViews<T> v(a);
  DeviceView<T****> y("y", s.B, s.L, s.H, s.P);
  const auto forward = [&](auto edit, ssm::SsdOptions opts = ssm::SsdOptions()) {
    ssm::SsdForward<T, Space> f;
    v.set_inputs(f);
    f.y = y;
    edit(f);
    ssm::ssd_forward(Space(), f, opts);
  };
  using F = ssm::SsdForward<T, Space>;
  EXPECT_KDNN_ERROR(forward([](F&) {}, ssm::SsdOptions{0}), "chunk=0, expected Q >= 1");
  EXPECT_KDNN_ERROR(forward([](F& f) { f.dt = DeviceView<T***>("dt", 1, 9, 4); }),
                    "dt has extent(1)=9, expected 10");
  DeviceView<T****> b3("b3", 1, 10, 3, 2);
  EXPECT_KDNN_ERROR(forward([&](F& f) { f.B = f.C = b3; }),
                    "B has extent(2)=3, expected a number of groups G >= 1 that divides H=4");
  EXPECT_KDNN_ERROR(forward([&](F& f) { f.C = b3; }), "C has extent(2)=3, expected 2");
  EXPECT_KDNN_ERROR(forward([](F& f) { f.A = DeviceView<T*>("A", 3); }), "A has extent(0)=3");
  EXPECT_KDNN_ERROR(forward([](F& f) { f.D = DeviceView<T*>("D", 8); }),
                    "D has extent(0)=8, expected H=4 (per head) or H·P=12 (per channel)");
  EXPECT_KDNN_ERROR(forward([](F& f) { f.initial_state = DeviceView<T****>("i", 1, 4, 3, 3); }),
                    "initial_state has extent(3)=3, expected 2");
  EXPECT_KDNN_ERROR(forward([&](F& f) { f.y = DeviceView<T****>("y", 1, 10, 4, 2); }),
                    "y has extent(3)=2, expected 3");
  EXPECT_KDNN_ERROR(forward([&](F& f) {
                      f.y = kdnn::Tensor4<T, Space>(const_cast<T*>(v.x.data()), 1, 10, 4, 3);
                    }),
                    "output y overlaps input x");
  // A > 0 is refused only when asked for.
  DeviceView<T*> positive = to_device<T*>({-1, -0.5, 0.25, -2}, 4);
  EXPECT_KDNN_ERROR(forward([&](F& f) { f.A = positive; }, ssm::SsdOptions{8, true}),
                    "A[2]=0.25, expected a finite A <= 0");
  EXPECT_NO_THROW(forward([&](F& f) { f.A = positive; }, ssm::SsdOptions{8, false}));
  // -inf would zero every decay and make dt's gradient NaN.
  DeviceView<T*> minus_inf = to_device<T*>({-1, -std::numeric_limits<T>::infinity(), -0.5, -2}, 4);
  EXPECT_KDNN_ERROR(forward([&](F& f) { f.A = minus_inf; }, ssm::SsdOptions{8, true}),
                    "A[1]=-inf, expected a finite A <= 0");

  ssm::SsdBackward<T, Space> g;
  v.set_inputs(g);
  g.dy = v.dy;
  DeviceView<T****> dx("dx", 1, 10, 4, 3), dB("dB", 1, 10, 2, 2), dC("dC", 1, 10, 2, 2);
  DeviceView<T***> ddt("ddt", 1, 10, 4);
  DeviceView<T*> dA("dA", 4);
  g.dx = dx;
  g.ddt = ddt;
  g.dA = dA;
  g.dB = dB;
  g.dC = dC;
  EXPECT_NO_THROW(ssm::ssd_backward(Space(), g));
  g.dC = DeviceView<T****>("dC", 1, 10, 4, 2);
  EXPECT_KDNN_ERROR(ssm::ssd_backward(Space(), g), "dC has extent(2)=4, expected 2 (same as C)");
  g.dC = dB;
  EXPECT_KDNN_ERROR(ssm::ssd_backward(Space(), g), "outputs dB and dC overlap");
  g.dC = dC;
  g.dD = DeviceView<T*>("dD", 12);  // D has H values
  EXPECT_KDNN_ERROR(ssm::ssd_backward(Space(), g), "dD has extent(0)=12, expected D's 4");
}

}  // namespace
