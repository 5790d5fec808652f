// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// One causal conv1d case (conv_reference.hpp's ConvCase) through kdnn's
// forward and backward on the device in any storage type; shared by the
// conv tests.
#include <cstddef>

#include "conv_reference.hpp"
#include "kdnn/ssm/causal_conv1d.hpp"
#include "views.hpp"

namespace kdnn_test::conv_runs {

using ssm_ref::ConvCase;
using ssm_ref::ConvShape;
using ssm_ref::Vec;
namespace ssm = kdnn::ssm;

enum Given : unsigned { kBias = 1, kInit = 2, kDfinal = 4, kAll = 7 };

inline ConvCase make_conv_case(ConvShape s, unsigned given, bool silu, unsigned seed) {
  ConvCase a;
  a.s = s;
  a.silu = silu;
  const std::size_t nx = std::size_t(s.B) * s.L * s.C, ns = std::size_t(s.B) * (s.K - 1) * s.C;
  a.x = normal(nx, seed);
  a.w = uniform(std::size_t(s.C) * s.K, -0.6, 0.6, seed + 1);
  if (given & kBias) a.bias = uniform(s.C, -0.5, 0.5, seed + 2);
  if (given & kInit) a.init = normal(ns, seed + 3);
  a.dy = normal(nx, seed + 4);
  if (given & kDfinal) a.dfinal = normal(ns, seed + 5);
  return a;
}

/// The Views of one case: the activations in T, w and bias in compute_t<T>.
template <class T>
struct ConvViews {
  using C = kdnn::compute_t<T>;
  DeviceView<T***> x, init, dy, dfinal;
  DeviceView<C**> w;
  DeviceView<C*> bias;
  explicit ConvViews(const ConvCase& a) {
    const auto& s = a.s;
    x = to_device<T***>(a.x, s.B, s.L, s.C);
    w = to_device<C**>(a.w, s.C, s.K);
    dy = to_device<T***>(a.dy, s.B, s.L, s.C);
    if (!a.bias.empty()) bias = to_device<C*>(a.bias, s.C);
    if (!a.init.empty()) init = to_device<T***>(a.init, s.B, s.K - 1, s.C);
    if (!a.dfinal.empty()) dfinal = to_device<T***>(a.dfinal, s.B, s.K - 1, s.C);
  }
};

inline ssm::CausalConv1dOptions conv_options(bool silu, kdnn::KernelForm form) {
  ssm::CausalConv1dOptions o;
  o.silu = silu;
  o.launch.form = form;
  return o;
}

template <class T>
ssm_ref::ConvForwardResult run_conv_forward(const ConvCase& a,
                                            kdnn::KernelForm form = kdnn::KernelForm::automatic) {
  const auto& s = a.s;
  ConvViews<T> v(a);
  DeviceView<T***> y("y", s.B, s.L, s.C), fin("final", s.B, s.K - 1, s.C);
  ssm::ConvForward<T, Space> args;
  args.x = v.x;
  args.w = v.w;
  args.bias = v.bias;
  args.initial_state = v.init;
  args.y = y;
  args.final_state = fin;
  ssm::causal_conv1d_forward(Space(), args, conv_options(a.silu, form));
  return {to_host(y), to_host(fin)};
}

template <class T>
ssm_ref::ConvBackwardResult run_conv_backward(const ConvCase& a, bool want_dbias = true,
                                              bool want_dinit = true,
                                              kdnn::KernelForm form = kdnn::KernelForm::automatic) {
  const auto& s = a.s;
  ConvViews<T> v(a);
  DeviceView<T***> dx("dx", s.B, s.L, s.C), dinit;
  using C = kdnn::compute_t<T>;
  DeviceView<C**> dw("dw", s.C, s.K);
  DeviceView<C*> dbias;
  if (want_dbias) dbias = DeviceView<C*>("dbias", s.C);
  if (want_dinit) dinit = DeviceView<T***>("dinit", s.B, s.K - 1, s.C);
  Kokkos::deep_copy(dw, C(99));  // overwritten, never accumulated into
  ssm::ConvBackward<T, Space> args;
  args.x = v.x;
  args.w = v.w;
  args.bias = v.bias;
  args.initial_state = v.init;
  args.dy = v.dy;
  args.dfinal_state = v.dfinal;
  args.dx = dx;
  args.dw = dw;
  args.dbias = dbias;
  args.dinitial_state = dinit;
  ssm::causal_conv1d_backward(Space(), args, conv_options(a.silu, form));
  return {to_host(dx), to_host(dw), want_dbias ? to_host(dbias) : Vec{},
          want_dinit ? to_host(dinit) : Vec{}};
}

}  // namespace kdnn_test::conv_runs
