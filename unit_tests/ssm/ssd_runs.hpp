// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// One SSD case (ssd_reference.hpp's SsdCase) through kdnn's forward and
// backward on the device, with the tolerances the SSD tests compare with
// the float64 recurrence; shared by the SSD tests.
#include <cmath>

#include "allclose.hpp"
#include "kdnn/ssm/ssd.hpp"
#include "ssd_reference.hpp"
#include "ssd_views.hpp"
#include "views.hpp"

namespace kdnn_test {

inline kdnn::ssm::SsdOptions options(int chunk, kdnn::KernelForm form) {
  kdnn::ssm::SsdOptions o;
  o.chunk = chunk;
  o.launch.form = form;
  return o;
}

template <class T>
ssm_ref::SsdForwardResult run_forward(const ssm_ref::SsdCase& a, int chunk,
                                      kdnn::KernelForm form = kdnn::KernelForm::automatic) {
  const auto& s = a.s;
  SsdViews<T> v(a);
  DeviceView<T****> y("y", s.B, s.L, s.H, s.P), fin("final", s.B, s.H, s.P, s.N);
  kdnn::ssm::SsdForward<T, Space> args;
  v.set_inputs(args);
  args.y = y;
  args.final_state = fin;
  kdnn::ssm::ssd_forward(Space(), args, options(chunk, form));
  return {to_host(y), to_host(fin)};
}

/// kdnn::ssm::ssd_backward (one fused kernel for both halves of a chunk).
struct FusedBackward {
  template <class Args>
  void operator()(const Args& args, const kdnn::ssm::SsdOptions& opts) const {
    kdnn::ssm::ssd_backward(Space(), args, opts);
  }
};

/// The single-rank backward as the context-parallel one composes it at one
/// rank: the Y_diag half and the state half as two kernels, handing over
/// through the gradients and a da_diag buffer.
struct BackwardInHalves {
  template <class T>
  void operator()(const kdnn::ssm::SsdBackward<T, Space>& a,
                  const kdnn::ssm::SsdOptions& opts) const {
    namespace impl = kdnn::ssm::impl;
    const char* op = "test";
    impl::ChunkStates<T, Space> states, dstates;
    impl::ChunkDecays<T, Space> decay;
    impl::chunk_states<Space, T>(op, Space(), a, opts, states, decay);
    impl::state_pass(Space(), states, decay, a.initial_state, kdnn::Tensor4<T, Space>());
    impl::chunk_dstates(op, Space(), a, opts, dstates);
    impl::reverse_state_pass(Space(), dstates, decay, a.dfinal_state, a.dinitial_state,
                             int(a.x.extent(3)));
    auto g = impl::gradient_buffers(a);
    impl::diag_backward(op, Space(), a, opts, g);
    impl::state_backward(op, Space(), a, opts, states, dstates, g);
  }
};

template <class T, class Run = FusedBackward>
ssm_ref::SsdBackwardResult run_backward(const ssm_ref::SsdCase& a, int chunk,
                                        kdnn::KernelForm form = kdnn::KernelForm::automatic,
                                        const Run& run = Run()) {
  const auto& s = a.s;
  SsdViews<T> v(a);
  DeviceView<T****> dx("dx", s.B, s.L, s.H, s.P), dB("dB", s.B, s.L, s.G, s.N),
      dC("dC", s.B, s.L, s.G, s.N), dinit("dinit", s.B, s.H, s.P, s.N);
  DeviceView<T***> ddt("ddt", s.B, s.L, s.H);
  DeviceView<T*> dA("dA", s.H), dD("dD", s.H);
  Kokkos::deep_copy(dA, T(99));  // overwritten, never accumulated into
  Kokkos::deep_copy(dD, T(99));
  kdnn::ssm::SsdBackward<T, Space> args;
  v.set_inputs(args);
  args.dy = v.dy;
  args.dfinal_state = v.dfinal;
  args.dx = dx;
  args.ddt = ddt;
  args.dA = dA;
  args.dB = dB;
  args.dC = dC;
  args.dD = dD;
  args.dinitial_state = dinit;
  run(args, options(chunk, form));
  return {to_host(dx), to_host(ddt), to_host(dA),   to_host(dB),
          to_host(dC), to_host(dD),  to_host(dinit)};
}

template <class T>
constexpr double tol() {
  return sizeof(T) == 4 ? 1e-4 : 1e-11;
}

/// Absolute tolerance for sums of `terms` terms of size ~1.
template <class T>
double sum_tol(double terms) {
  return tol<T>() * std::sqrt(terms + 1);
}

/// A forward and backward (f, g) against the float64 recurrence and its
/// adjoint, to the tolerances of sums of their lengths.
template <class T>
void expect_recurrence(const ssm_ref::SsdCase& a, const ssm_ref::SsdForwardResult& f,
                       const ssm_ref::SsdBackwardResult& g) {
  const auto& s = a.s;
  const auto expected = ssm_ref::ssd_forward(a);
  const double atol = sum_tol<T>(s.N * 4.0);
  EXPECT_ALLCLOSE(f.y, expected.y, tol<T>(), atol);
  EXPECT_ALLCLOSE(f.final_state, expected.final_state, tol<T>(), atol);
  const auto eb = ssm_ref::ssd_backward(a);
  const double step = sum_tol<T>(4.0 * s.P * s.N);
  EXPECT_ALLCLOSE(g.dx, eb.dx, tol<T>(), step);
  EXPECT_ALLCLOSE(g.ddt, eb.ddt, tol<T>(), step);
  EXPECT_ALLCLOSE(g.dB, eb.dB, tol<T>(), step * s.H);
  EXPECT_ALLCLOSE(g.dC, eb.dC, tol<T>(), step * s.H);
  const double param = sum_tol<T>(4.0 * s.P * s.N * s.B * s.L);
  EXPECT_ALLCLOSE(g.dA, eb.dA, tol<T>(), param);
  EXPECT_ALLCLOSE(g.dD, eb.dD, tol<T>(), param);
  EXPECT_ALLCLOSE(g.dinit, eb.dinit, tol<T>(), step);
}

}  // namespace kdnn_test
