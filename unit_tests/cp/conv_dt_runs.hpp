// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The context-parallel conv + dt tests' problems and runs: one whole
// sequence's inputs, and the run of cp::conv_dt_forward/backward on this
// rank's steps of it (or of the single-rank operators on all of them).
#pragma once
#include <gtest/gtest.h>
#include <mpi.h>

#include <vector>

#include "conv_reference.hpp"
#include "kdnn/cp/cp.hpp"
#include "kdnn/ssm/ssm.hpp"
#include "rank_splits.hpp"
#include "test_layouts.hpp"
#include "views.hpp"

namespace kdnn_test {

using ssm_ref::Vec;
namespace cp = kdnn::cp;
namespace ssm = kdnn::ssm;

/// One whole-sequence problem: conv inputs [B, L, C], dt [B, L, H] and the
/// upstream gradients.
struct Problem {
  int B, L, C, K, H;
  bool bias, init, dfinal;
  Vec x, w, b, h0, dy, dfin, dt, dt_bias, ddt_out;
  Vec seq;  ///< [B, L] sequence ids, or empty

  Problem(int B_, int L_, int C_, int K_, int H_, bool bias_, bool init_, bool dfinal_)
      : B(B_), L(L_), C(C_), K(K_), H(H_), bias(bias_), init(init_), dfinal(dfinal_) {
    const std::size_t n = std::size_t(B) * L * C, ns = std::size_t(B) * (K - 1) * C;
    x = normal(n, 1);
    w = uniform(std::size_t(C) * K, -0.6, 0.6, 2);
    if (bias) b = uniform(C, -0.5, 0.5, 3);
    if (init) h0 = normal(ns, 4);
    dy = normal(n, 5);
    if (dfinal) dfin = normal(ns, 6);
    dt = uniform(std::size_t(B) * L * H, -4, 4, 7);
    dt_bias = uniform(H, -1, 1, 8);
    ddt_out = normal(dt.size(), 9);
  }
};

/// Every output and gradient of one run, flat.
struct Result {
  Vec y, final_state, dt_out, dx, dw, dbias, dinit, ddt, ddt_bias;
};

/// The run on this rank's local steps, its `segments` of the whole
/// sequence (one segment [0, L) and `comm` = null: the single-rank operators
/// on the whole sequence), with `plan` if given (over `comm`; without one,
/// the segment is the rank's of a contiguous split). Rank 0 holds the
/// initial state and its gradient; every rank asks for its final state,
/// `dfinal_here` gets d(final state).
template <class T>
Result run_segments(const Problem& p, const std::vector<cp::Segment>& segments, MPI_Comm comm,
                    bool dfinal_here, cp::HaloStats* fwd = nullptr, cp::HaloStats* bwd = nullptr,
                    const cp::HaloPlan* plan = nullptr) {
  using P = kdnn::compute_t<T>;  // the parameters' and step sizes' type
  const bool single = comm == MPI_COMM_NULL;
  const int rank = single ? 0 : comm_rank();
  const int B = p.B, C = p.C, K = p.K, H = p.H;
  int n = 0;
  for (const auto& s : segments) n += int(s.steps());
  const int rows = int(segments.size()) * (K - 1);
  const auto x = to_device<T***>(local_steps(p.x, B, p.L, C, segments), B, n, C);
  const auto dy = to_device<T***>(local_steps(p.dy, B, p.L, C, segments), B, n, C);
  const auto dt = to_device<T***>(local_steps(p.dt, B, p.L, H, segments), B, n, H);
  const auto ddt_out = to_device<P***>(local_steps(p.ddt_out, B, p.L, H, segments), B, n, H);
  const auto w = to_device<P**>(p.w, C, K);
  const auto dt_bias = to_device<P*>(p.dt_bias, H);
  DeviceView<P*> bias, dbias;
  DeviceView<T***> init, dinit, dfinal;
  if (p.bias) bias = to_device<P*>(p.b, C), dbias = DeviceView<P*>("dbias", C);
  if (p.init && rank == 0) {
    init = to_device<T***>(p.h0, B, K - 1, C);
    dinit = DeviceView<T***>("dinit", B, K - 1, C);
  }
  if (p.dfinal && dfinal_here) dfinal = to_device<T***>(p.dfin, B, K - 1, C);
  DeviceView<T***> y("y", B, n, C), fin("final", B, K - 1, C), halo("halo", B, rows, C);
  DeviceView<P***> dt_out("dt_out", B, n, H);
  DeviceView<T***> dx("dx", B, n, C), ddt("ddt", B, n, H);
  DeviceView<P**> dw("dw", C, K);
  DeviceView<P*> ddt_bias("ddt_bias", H);
  DeviceView<int**> seq;
  if (!p.seq.empty()) seq = to_device<int**>(local_steps(p.seq, B, p.L, 1, segments), B, n);

  ssm::ConvForward<T, Space> f;
  f.x = x, f.w = w, f.bias = bias, f.initial_state = init, f.y = y, f.final_state = fin;
  f.seq_idx = seq;
  ssm::ConvBackward<T, Space> g;
  g.x = x, g.w = w, g.bias = bias, g.dy = dy, g.dfinal_state = dfinal, g.seq_idx = seq;
  g.dx = dx, g.dw = dw, g.dbias = dbias, g.dinitial_state = dinit;
  if (single) {
    ssm::causal_conv1d_forward(Space(), f);
    ssm::dt_softplus_forward(Space(), dt, dt_bias, dt_out);
    g.initial_state = init;
    ssm::causal_conv1d_backward(Space(), g);
    ssm::dt_softplus_backward(Space(), dt, dt_bias, ddt_out, ddt, ddt_bias);
  } else {
    cp::ConvDtForward<T, Space> cf;
    cf.conv = f, cf.halo = halo, cf.dt = dt, cf.dt_bias = dt_bias, cf.dt_out = dt_out;
    const auto sf =
        plan ? cp::conv_dt_forward(Space(), *plan, cf) : cp::conv_dt_forward(Space(), comm, cf);
    g.initial_state = halo;
    cp::ConvDtBackward<T, Space> cb;
    cb.conv = g, cb.dt = dt, cb.dt_bias = dt_bias, cb.ddt_out = ddt_out, cb.ddt = ddt;
    cb.ddt_bias = ddt_bias;
    const auto sb =
        plan ? cp::conv_dt_backward(Space(), *plan, cb) : cp::conv_dt_backward(Space(), comm, cb);
    cp::allreduce_sum(comm, dw);
    if (p.bias) cp::allreduce_sum(comm, dbias);
    cp::allreduce_sum(comm, ddt_bias);
    if (fwd) *fwd = sf;
    if (bwd) *bwd = sb;
  }
  Result r{to_host(y),
           to_host(fin),
           to_host(dt_out),
           to_host(dx),
           to_host(dw),
           p.bias ? to_host(dbias) : Vec{},
           dinit.size() ? to_host(dinit) : Vec{},
           to_host(ddt),
           to_host(ddt_bias)};
  return r;
}

/// The run on this rank's steps [first, first + n) of a contiguous split
/// (first = 0, n = L and `comm` = null: the single-rank operators); the last
/// rank gets d(final state).
template <class T>
Result run(const Problem& p, int first, int n, MPI_Comm comm, cp::HaloStats* fwd = nullptr,
           cp::HaloStats* bwd = nullptr, const cp::HaloPlan* plan = nullptr) {
  const bool last = comm == MPI_COMM_NULL || comm_rank() == comm_size() - 1;
  return run_segments<T>(p, {{first, first + n}}, comm, last, fwd, bwd, plan);
}

/// Zero-filled arguments of a forward call on n steps, for the checks' tests.
inline cp::ConvDtForward<double, Space> zero_forward(int B, int n, int C, int K, int H) {
  cp::ConvDtForward<double, Space> a;
  a.conv.x = DeviceView<double***>("x", B, n, C);
  a.conv.w = DeviceView<double**>("w", C, K);
  a.conv.y = DeviceView<double***>("y", B, n, C);
  a.halo = DeviceView<double***>("halo", B, K - 1, C);
  a.dt = DeviceView<double***>("dt", B, n, H);
  a.dt_bias = DeviceView<double*>("dt_bias", H);
  a.dt_out = DeviceView<double***>("dt_out", B, n, H);
  return a;
}

inline void expect_same(const Result& a, const Result& b) {
  EXPECT_EQ(a.y, b.y);
  EXPECT_EQ(a.final_state, b.final_state);
  EXPECT_EQ(a.dt_out, b.dt_out);
  EXPECT_EQ(a.dx, b.dx);
  EXPECT_EQ(a.dw, b.dw);
  EXPECT_EQ(a.dbias, b.dbias);
  EXPECT_EQ(a.dinit, b.dinit);
  EXPECT_EQ(a.ddt, b.ddt);
  EXPECT_EQ(a.ddt_bias, b.ddt_bias);
}

}  // namespace kdnn_test
