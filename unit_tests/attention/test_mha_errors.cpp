// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Multi-head attention layer on bad input, on both attention algorithms
// (fused and unfused): each bad argument a kdnn::Error naming it, a scale
// finite in double but not in float, the mask checked once per layer call,
// nothing written when a check fails, the fused path's scratch limit checked
// before anything is written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "allclose.hpp"
#include "expect_error.hpp"
#include "kdnn/attention/fused_attention.hpp"
#include "kdnn/attention/mha.hpp"
#include "mha_cases.hpp"
#include "mha_layer.hpp"
#include "mha_reference.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;
namespace at = kdnn::attention;

void forward(DeviceLayer<double>& l) { l.forward(); }

/// opts.heads that does not divide w_q's rows, and none.
void expect_head_errors(const DeviceLayer<double>& base) {
  using T = double;
  DeviceLayer<T> l = base;
  l.opts.heads = 4;  // H·D = 6 rows
  EXPECT_KDNN_ERROR(forward(l),
                    "weights.w_q has extent(0)=6, expected a positive multiple of opts.heads=4");
  l.opts.heads = 0;
  EXPECT_KDNN_ERROR(forward(l), "opts.heads=0, expected at least 1");
}

/// Grouped-query attention: Hkv divides H, w_k and w_v have Hkv heads.
void expect_grouped_query_errors(const DeviceLayer<double>& base, const MhaCase& c) {
  using T = double;
  DeviceLayer<T> l = base;  // H = 2, D = 3, Dv = 2
  l.opts.kv_heads = 3;
  EXPECT_KDNN_ERROR(forward(l),
                    "opts.kv_heads=3, expected a divisor of opts.heads=2 (or 0: opts.heads)");
  l.opts.kv_heads = -1;
  EXPECT_KDNN_ERROR(forward(l), "opts.kv_heads=-1, expected a divisor of opts.heads=2");
  l.opts.kv_heads = 1;  // w_v [H·Dv = 4, E_v] reads as Hkv·Dv with Dv = 4, w_k as D = 3
  EXPECT_KDNN_ERROR(forward(l),
                    "weights.w_k has extent(0)=6, expected 3 (Hkv·D, D from "
                    "weights.w_q)");
  l.w.w_k = DeviceView<T**>("w_k", c.D, c.Ek);
  EXPECT_KDNN_ERROR(forward(l),
                    "weights.w_o has extent(1)=4, expected 8 (H·Dv, Dv from "
                    "weights.w_v)");
  l.w.w_v = DeviceView<T**>("w_v", c.Dv, c.Ev);
  EXPECT_KDNN_ERROR(forward(l), "weights.b_k has extent(0)=6, expected 3 (Hkv·D)");
  at::MhaShape shape = base.shape();
  shape.kv_heads = 3;
  EXPECT_KDNN_ERROR(at::mha_buffer_sizes(shape),
                    "attention::mha_buffer_sizes: shape.kv_heads=3, expected a divisor of "
                    "shape.heads=2");
}

/// Inputs, weights, biases and the residual of the wrong extents.
void expect_shape_errors(const DeviceLayer<double>& base, const MhaCase& c) {
  using T = double;
  DeviceLayer<T> l = base;
  l.q = DeviceView<T***>("q", c.B, c.S, c.Eq + 1);
  EXPECT_KDNN_ERROR(forward(l), "q has extent(2)=6, expected 5 (E_q, weights.w_q's extent(1))");
  l = base;
  l.v = DeviceView<T***>("v", c.B, c.Sk + 1, c.Ev);
  EXPECT_KDNN_ERROR(forward(l), "v has extent(1)=5, expected 4 (the key length of k)");
  l = base;
  l.w.w_o = DeviceView<T**>("w_o", c.Eo, c.H * c.Dv + 1);
  EXPECT_KDNN_ERROR(forward(l), "weights.w_o has extent(1)=5, expected 4");
  l = base;
  l.w.b_v = DeviceView<T*>("b_v", 3);
  EXPECT_KDNN_ERROR(forward(l), "weights.b_v has extent(0)=3, expected 4 (H·Dv)");
  l = base;
  l.residual = DeviceView<T***>("residual", c.B, c.S + 1, c.Eo);
  EXPECT_KDNN_ERROR(forward(l), "residual has extent(1)=4, expected 3 (same as out)");
}

/// Sequence lengths past S and windows with lo > hi.
void expect_mask_errors(const DeviceLayer<double>& base, const MhaCase& c) {
  using T = double;
  DeviceLayer<T> l = base;
  DeviceView<int*> seq_q("seq_q", c.B);
  Kokkos::deep_copy(seq_q, c.S + 1);
  l.mask.seq_q = seq_q;
  EXPECT_KDNN_ERROR(forward(l), "mask.seq_q[0]=4, expected a value in [0, 3]");
  l = base;
  DeviceView<int*> lo("lo", c.S), hi("hi", c.S);
  Kokkos::deep_copy(lo, 3);
  Kokkos::deep_copy(hi, 2);
  l.mask.lo_win = lo, l.mask.hi_win = hi;
  EXPECT_KDNN_ERROR(forward(l), "mask.lo_win[0]=3 > mask.hi_win[0]=2");
}

/// A dropout outside [0, 1) and a scale that is not finite.
void expect_option_errors(const DeviceLayer<double>& base) {
  using T = double;
  DeviceLayer<T> l = base;
  l.opts.dropout.p = 1;
  EXPECT_KDNN_ERROR(forward(l), "opts.dropout.p=1, expected a value in [0, 1)");
  l.opts.dropout.p = -0.1;
  EXPECT_KDNN_ERROR(forward(l), "opts.dropout.p=-0.1");
  l = base;
  l.opts.sm_scaler = NAN;
  EXPECT_KDNN_ERROR(forward(l), "opts.sm_scaler=nan, expected a finite value");
}

/// Buffers too small, and outputs that overlap an input or each other.
void expect_buffer_errors(const DeviceLayer<double>& base, const MhaCase& c) {
  using T = double;
  {
    DeviceLayer<T> l = base;
    l.reserve = DeviceView<T*>("reserve", l.reserve.size() - 1);
    EXPECT_KDNN_ERROR(forward(l), "reserve has extent(0)=");
    l = base;
    l.workspace = DeviceView<T*>(base.workspace.data(), base.workspace.size() - 1);
    EXPECT_KDNN_ERROR(forward(l), "workspace has extent(0)=");
  }
  {
    DeviceLayer<T> l = base;
    l.residual = DeviceView<T***>("residual", c.B, c.S, c.Eo);
    l.out = DeviceView<T***>(l.residual.data(), c.B, c.S, c.Eo);
    EXPECT_KDNN_ERROR(forward(l), "output out overlaps input residual");
    l = base;
    l.out = DeviceView<T***>(reinterpret_cast<T*>(l.workspace.data()), c.B, c.S, c.Eo);
    EXPECT_KDNN_ERROR(forward(l), "outputs out and workspace overlap");
  }
}

/// The backward's overlapping outputs, a bias gradient without its bias,
/// and a mode that is neither set nor add.
void expect_backward_errors(const DeviceLayer<double>& base, const MhaCase& c) {
  using T = double;
  DeviceLayer<T> l = base;
  l.forward();
  l.dq = DeviceView<T***>(l.dout.data(), c.B, c.S, c.Eq);
  EXPECT_KDNN_ERROR(l.backward(), "output dq overlaps input dout");
  l = base;
  l.forward();
  l.dw.w_q = DeviceView<T**>(l.w.w_q.data(), c.H * c.D, c.Eq);
  EXPECT_KDNN_ERROR(l.backward(), "output grads.w_q overlaps input weights.w_q");
  l = base;
  l.forward();
  l.dw.b_o = DeviceView<T*>("db_o", c.Eo);
  l.w.b_o = {};
  EXPECT_KDNN_ERROR(l.backward(), "grads.b_o given but weights.b_o is not");
  l = base;
  l.forward();
  EXPECT_KDNN_ERROR(l.backward(at::WgradMode(7)),
                    "mode=7, expected WgradMode::set or WgradMode::add");
}

/// An algorithm that is neither fused nor unfused, and buffers sized for
/// the fused layer given to the unfused one.
void expect_algo_errors(const MhaCase& c, const MhaData& d) {
  using T = double;
  DeviceLayer<T> l = DeviceLayer<T>(c, d);
  l.opts.algo = at::AttentionAlgo(7);
  EXPECT_KDNN_ERROR(l.forward(),
                    "attention::mha_forward: opts.algo=7, expected AttentionAlgo::fused or "
                    "AttentionAlgo::unfused");
  EXPECT_KDNN_ERROR(l.backward(), "attention::mha_backward_data: opts.algo=7");
  EXPECT_KDNN_ERROR(at::mha_buffer_sizes(l.shape()), "attention::mha_buffer_sizes: shape.algo=7");
  // Buffers sized for the fused layer are too small for the unfused one.
  l.opts.algo = at::AttentionAlgo::unfused;
  EXPECT_KDNN_ERROR(l.forward(), "reserve has extent(0)=");
}

TEST(MhaErrors, BadInputIsAKdnnErrorNamingTheArgument) {
  using T = double;
  const MhaCase c = mha_cases()[0];
  const MhaData d = MhaData::random(c, 800);
  for (const auto algo : kAlgos) {
    SCOPED_TRACE(name_of(algo));
    DeviceLayer<T> base(c, d, algo);
    expect_head_errors(base);
    expect_grouped_query_errors(base, c);
    expect_shape_errors(base, c);
    expect_mask_errors(base, c);
    expect_option_errors(base);
    expect_buffer_errors(base, c);
    expect_backward_errors(base, c);
  }
  expect_algo_errors(c, d);
}

// A scale that is a finite double but not a finite float (the type the
// layer computes in) is an error, not NaN outputs.
TEST(MhaErrors, ScaleNotFiniteInFloatIsAKdnnError) {
  MhaCase c = mha_cases()[0];
  c.bias_q = c.bias_k = false;
  MhaData d = MhaData::random(c, 801);
  for (double& x : d.q) x *= 0.01;  // (1e38·Q)·K stays within float's range
  for (double& x : d.k) x *= 0.01;
  for (const auto algo : kAlgos) {
    SCOPED_TRACE(name_of(algo));
    DeviceLayer<float> l(c, d, algo);
    for (const double scale : {1e39, -1e39}) {
      l.opts.sm_scaler = scale;
      EXPECT_KDNN_ERROR(l.forward(),
                        "e+39, expected a value finite in float (|opts.sm_scaler| <= "
                        "3.40282e+38)");
    }
    l.opts.sm_scaler = 1e38;  // finite in float: fine for these moderate scores
    l.forward();
    const auto o = to_host(l.out);
    EXPECT_TRUE(std::all_of(o.begin(), o.end(), [](double x) { return std::isfinite(x); }));
  }
}

/// Profiling regions named `name` pushed while counting (Kokkos' tools
/// callbacks).
struct RegionCounter {
  static inline std::string name;
  static inline int count = 0;
  static void push(const char* region) { count += name == region; }
  explicit RegionCounter(std::string region) {
    name = std::move(region);
    count = 0;
    Kokkos::Tools::Experimental::set_push_region_callback(&push);
  }
  ~RegionCounter() { Kokkos::Tools::Experimental::set_push_region_callback(nullptr); }
};

// The mask's vectors are checked on the host once per layer call (on a GPU
// each check is a copy to the host that waits for the device), not again by
// the attention the layer runs inside.
TEST(MhaMask, CheckedOncePerLayerCall) {
  MhaCase c = mha_case_with_everything();
  const MhaData d = MhaData::random(c, 810);
  for (const auto algo : kAlgos) {
    SCOPED_TRACE(name_of(algo));
    DeviceLayer<double> l(c, d, algo);
    l.forward();
    l.backward();
    Space().fence();
    RegionCounter checks("kdnn::attention::check_mask");
    l.forward();
    EXPECT_EQ(RegionCounter::count, 1) << "forward";
    l.backward();
    EXPECT_EQ(RegionCounter::count, 2) << "forward and backward";
  }
}

TEST(MhaErrors, NothingIsWrittenWhenACheckFails) {
  using T = double;
  const MhaCase c = mha_cases()[0];
  for (const auto algo : kAlgos) {
    SCOPED_TRACE(name_of(algo));
    DeviceLayer<T> l(c, MhaData::random(c, 900), algo);
    Kokkos::deep_copy(l.out, 5.0);
    l.w.b_o = DeviceView<T*>("b_o", c.Eo + 1);
    EXPECT_KDNN_ERROR(l.forward(), "weights.b_o has extent(0)=5");
    for (double x : to_host(l.out)) EXPECT_EQ(x, 5.0);
    for (double x : to_host(l.reserve)) EXPECT_EQ(x, 0.0);
  }
}

/// Whether fused attention refuses heads of D = Dv on this backend (its
/// team scratch per block grows with D), in its forward or its backward.
bool fused_attention_refuses(int D, bool backward) {
  using T = double;
  DeviceView<T****> q("q", 1, 1, 1, D), k("k", 1, 1, 1, D), v("v", 1, 1, 1, D), o("o", 1, 1, 1, D),
      g("g", 1, 1, 1, D), dq("dq", 1, 1, 1, D), dk("dk", 1, 1, 1, D), dv("dv", 1, 1, 1, D);
  DeviceView<T***> lse("lse", 1, 1, 1);
  try {
    if (backward) {
      at::fused_attention_backward(Space(), q, k, v, o, lse, g, dq, dk, dv);
    } else {
      at::fused_attention_forward(Space(), q, k, v, o, lse);
    }
    Kokkos::fence();
  } catch (const kdnn::Error&) {
    return true;
  }
  return false;
}

/// The smallest D = Dv that fused attention refuses, or 0 if none up to 2^20.
int smallest_refused_head_size(bool backward) {
  int accepted = 0, refused = 64;
  while (!fused_attention_refuses(refused, backward)) {
    if (refused >= (1 << 20)) return 0;
    accepted = refused, refused *= 2;
  }
  while (refused - accepted > 1) {
    const int mid = accepted + (refused - accepted) / 2;
    (fused_attention_refuses(mid, backward) ? refused : accepted) = mid;
  }
  return refused;
}

// Past the team scratch limit the fused path refuses the heads; the layer
// finds that out before it launches anything (nothing written), and the
// unfused path still computes them.
TEST(MhaErrors, FusedScratchLimitIsCheckedBeforeAnythingIsWritten) {
  using T = double;
  for (const bool backward : {false, true}) {
    SCOPED_TRACE(backward ? "backward" : "forward");
    const int D = smallest_refused_head_size(backward);
    if (D == 0) GTEST_SKIP() << "no head size up to 2^20 exceeds this backend's team scratch";
    if (backward && fused_attention_refuses(D, false)) continue;  // the forward case again
    MhaCase c;
    c.B = 1, c.S = 2, c.Sk = 3, c.Eq = c.Ek = c.Ev = c.Eo = 2, c.H = 1, c.D = c.Dv = D;
    c.residual = true;
    const MhaData d = MhaData::random(c, 950);
    DeviceLayer<T> l(c, d);
    for (const auto& x : {l.out, l.dq, l.dk, l.dv, l.dresidual}) Kokkos::deep_copy(x, 5.0);
    if (!backward) {
      EXPECT_KDNN_ERROR(l.forward(), "attention::mha_forward: blocks of");
      for (double x : to_host(l.out)) EXPECT_EQ(x, 5.0);
      for (double x : to_host(l.reserve)) EXPECT_EQ(x, 0.0);
    } else {
      l.forward();
      const auto reserve = to_host(l.reserve);
      EXPECT_KDNN_ERROR(l.backward(), "attention::mha_backward_data: blocks of");
      for (const auto& x : {l.dq, l.dk, l.dv, l.dresidual}) {
        for (double y : to_host(x)) EXPECT_EQ(y, 5.0);
      }
      EXPECT_EQ(to_host(l.reserve), reserve);
    }
    DeviceLayer<T> unfused(c, d, at::AttentionAlgo::unfused);
    unfused.forward(), unfused.backward();
    EXPECT_LT(rel_error(to_host(unfused.out), reference_mha_forward(c, d)), 1e-12);
  }
}

}  // namespace
