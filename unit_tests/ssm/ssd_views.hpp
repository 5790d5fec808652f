// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// One SSD case (ssd_reference.hpp's SsdCase) on the device, with the
// optional step-size bias and gate; shared by the SSD tests.
#include <string>

#include "ssd_reference.hpp"
#include "views.hpp"

namespace kdnn_test {

/// The Views of one case in T; the optional tensors (D [H] or [H·P], the
/// initial state, d(final state), dt_bias [H], z [B, L, H, P]) are empty
/// where the case leaves them out.
template <class T>
struct SsdViews {
  ssm_ref::SsdShape s;
  DeviceView<T****> x, Bm, Cm, init, dy, dfinal, z;
  DeviceView<T***> dt;
  DeviceView<T*> A, D, dt_bias;
  DeviceView<int**> seq;

  explicit SsdViews(const ssm_ref::SsdCase& a, const ssm_ref::Vec& bias = {},
                    const ssm_ref::Vec& gate = {})
      : s(a.s) {
    x = to_device<T****>(a.x, s.B, s.L, s.H, s.P);
    dt = to_device<T***>(a.dt, s.B, s.L, s.H);
    A = to_device<T*>(a.A, s.H);
    Bm = to_device<T****>(a.Bm, s.B, s.L, s.G, s.N);
    Cm = to_device<T****>(a.Cm, s.B, s.L, s.G, s.N);
    dy = to_device<T****>(a.dy, s.B, s.L, s.H, s.P);
    if (!a.D.empty()) D = to_device<T*>(a.D, a.D.size());
    if (!a.init.empty()) init = to_device<T****>(a.init, s.B, s.H, s.P, s.N);
    if (!a.dfinal.empty()) dfinal = to_device<T****>(a.dfinal, s.B, s.H, s.P, s.N);
    if (!bias.empty()) dt_bias = to_device<T*>(bias, s.H);
    if (!gate.empty()) z = to_device<T****>(gate, s.B, s.L, s.H, s.P);
    if (!a.seq.empty()) seq = to_device<int**>(a.seq, s.B, s.L);
  }

  /// The inputs of SsdForward or SsdBackward (x, dt, A, B, C, D, the
  /// initial state, dt_bias, z and seq_idx).
  template <class Args>
  void set_inputs(Args& args) const {
    args.x = x, args.dt = dt, args.A = A, args.B = Bm, args.C = Cm, args.D = D;
    args.initial_state = init, args.dt_bias = dt_bias, args.z = z, args.seq_idx = seq;
  }
  DeviceView<T****> like_x(const char* name) const {
    return DeviceView<T****>(std::string(name), s.B, s.L, s.H, s.P);
  }
  DeviceView<T****> like_state(const char* name) const {
    return DeviceView<T****>(std::string(name), s.B, s.H, s.P, s.N);
  }
};

}  // namespace kdnn_test
