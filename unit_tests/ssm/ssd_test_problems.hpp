// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// What the tests of the chunked SSD against the float64 recurrence share
// (test_ssd.cpp, test_ssd_gpu_forms.cpp, test_ssd_tensor_cores.cpp,
// test_ssd_errors.cpp): a random case of a shape with the optional inputs
// asked for, a shape with its chunk size, the typed suite's fixture, and the
// comparisons of two kernel forms.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "kdnn/ssm/ssd.hpp"
#include "ssd_reference.hpp"
#include "ssd_runs.hpp"
#include "ssd_views.hpp"
#include "views.hpp"

namespace kdnn_test {

enum Given : unsigned { kD = 1, kInit = 2, kDfinal = 4, kAll = 7 };

/// dt in [0.05, 0.6] and A in [−1.5, −0.2] by default: decays per step of
/// 0.4 … 0.99, so that a chunk sees both fast and slow decay.
inline ssm_ref::SsdCase make_case(ssm_ref::SsdShape s, unsigned given, unsigned seed,
                                  double a_lo = -1.5, double a_hi = -0.2) {
  ssm_ref::SsdCase a;
  a.s = s;
  const std::size_t nx = std::size_t(s.B) * s.L * s.H * s.P;
  const std::size_t nbc = std::size_t(s.B) * s.L * s.G * s.N;
  const std::size_t ns = std::size_t(s.B) * s.H * s.P * s.N;
  a.x = normal(nx, seed);
  a.dt = uniform(std::size_t(s.B) * s.L * s.H, 0.05, 0.6, seed + 1);
  a.A = uniform(s.H, a_lo, a_hi, seed + 2);
  a.Bm = normal(nbc, seed + 3);
  a.Cm = normal(nbc, seed + 4);
  a.dy = normal(nx, seed + 5);
  if (given & kD) a.D = uniform(s.H, -1, 1, seed + 6);
  if (given & kInit) a.init = normal(ns, seed + 7);
  if (given & kDfinal) a.dfinal = normal(ns, seed + 8);
  return a;
}

/// The SSD's typed suite (float and double): one fixture for the files
/// whose tests are Ssd/0.* and Ssd/1.*, each declaring the suite itself.
template <class T>
class Ssd : public ::testing::Test {};

/// (B, L, H, P, G, N) and a chunk size.
struct Config {
  ssm_ref::SsdShape s;
  int chunk;
};

inline std::string describe(const Config& c, unsigned given) {
  const auto& s = c.s;
  return ::testing::PrintToString(std::vector<int>{s.B, s.L, s.H, s.P, s.G, s.N}) +
         " Q=" + std::to_string(c.chunk) + " given=" + std::to_string(given);
}

/// The forward's y with the output kernel's halves run in turn (Y_diag +
/// D·x, then Y_off added), as the context-parallel forward runs them.
template <class T>
ssm_ref::Vec output_in_halves(const ssm_ref::SsdCase& a, const kdnn::ssm::SsdOptions& opts) {
  namespace impl = kdnn::ssm::impl;
  const auto& s = a.s;
  SsdViews<T> v(a);
  DeviceView<T****> y("y", s.B, s.L, s.H, s.P);
  kdnn::ssm::SsdForward<T, Space> f;
  v.set_inputs(f);
  f.y = y;
  impl::ChunkStates<T, Space> states;
  impl::ChunkDecays<T, Space> decay;
  impl::chunk_states<Space, T>("test", Space(), f, opts, states, decay);
  impl::state_pass(Space(), states, decay, f.initial_state, kdnn::Tensor4<T, Space>());
  impl::chunk_output("test", Space(), f, opts, states, true, false);
  impl::chunk_output("test", Space(), f, opts, states, false, true);
  return to_host(y);
}

/// Two forms' gradients g and h alike to `t` of each gradient's largest
/// entry (at least 1).
inline void expect_same_gradients(const ssm_ref::SsdBackwardResult& g,
                                  const ssm_ref::SsdBackwardResult& h, double t) {
  using ssm_ref::Vec;
  for (const auto& [name, pair] :
       std::vector<std::pair<const char*, std::pair<Vec, Vec>>>{{"dx", {g.dx, h.dx}},
                                                                {"ddt", {g.ddt, h.ddt}},
                                                                {"dB", {g.dB, h.dB}},
                                                                {"dC", {g.dC, h.dC}},
                                                                {"dA", {g.dA, h.dA}},
                                                                {"dD", {g.dD, h.dD}},
                                                                {"dinit", {g.dinit, h.dinit}}}) {
    double worst = 0, scale = 0;
    for (std::size_t i = 0; i < pair.first.size(); ++i) {
      worst = std::max(worst, std::abs(pair.first[i] - pair.second[i]));
      scale = std::max(scale, std::abs(pair.second[i]));
    }
    EXPECT_LE(worst, t * std::max(1.0, scale)) << name;
  }
}

/// The tolerance of two forms of y that sum Q·N + N·P products of a few
/// units each in other orders.
template <class T>
double form_tol(const Config& c) {
  return 4 * std::numeric_limits<T>::epsilon() * std::sqrt(double(c.chunk + c.s.P) * c.s.N);
}

}  // namespace kdnn_test
