// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Each step of the chunked SSD's backward (ssm/impl/ssd_steps.hpp) on the
// default execution space against the same step on the host execution
// space, in double, so that a device build names the first step that
// differs (a host build runs the same space twice: run-to-run equality).
// Both launch forms; P = 8 (host forms only) and P = N = 64 (the GPU forms
// under a GPU launch).
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "allclose.hpp"
#include "kdnn/ssm/ssd.hpp"
#include "random.hpp"
#include "ssd_reference.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;
namespace ssm = kdnn::ssm;
namespace impl = kdnn::ssm::impl;

using Steps = std::vector<std::pair<std::string, std::vector<double>>>;

/// The outputs of every backward step on ExecSpace, in order.
template <class ExecSpace>
Steps run_steps(const ssm_ref::SsdCase& a, int chunk, kdnn::KernelForm form) {
  using T = double;
  const auto& s = a.s;
  const char* op = "test";
  const ExecSpace space;
  ssm::SsdBackward<T, ExecSpace> args;
  using Memory = typename ExecSpace::memory_space;
  const auto in4 = [&](const std::vector<double>& v, int d1, int d2, int d3) {
    return to_view<T****, Memory>(v, s.B, d1, d2, d3);
  };
  args.x = in4(a.x, s.L, s.H, s.P);
  args.dt = to_view<T***, Memory>(a.dt, s.B, s.L, s.H);
  args.A = to_view<T*, Memory>(a.A, s.H);
  args.B = in4(a.Bm, s.L, s.G, s.N);
  args.C = in4(a.Cm, s.L, s.G, s.N);
  args.dy = in4(a.dy, s.L, s.H, s.P);
  using Out4 = kdnn::Tensor4<T, ExecSpace>;
  const Out4 dx("dx", s.B, s.L, s.H, s.P), dB("dB", s.B, s.L, s.G, s.N),
      dC("dC", s.B, s.L, s.G, s.N);
  const kdnn::Tensor3<T, ExecSpace> ddt("ddt", s.B, s.L, s.H);
  const kdnn::Vector<T, ExecSpace> dA("dA", s.H);
  args.dx = dx;
  args.ddt = ddt;
  args.dA = dA;
  args.dB = dB;
  args.dC = dC;
  ssm::SsdOptions opts;
  opts.chunk = chunk;
  opts.launch.form = form;
  Steps out;
  impl::ChunkStates<T, ExecSpace> states, dstates;
  impl::ChunkDecays<T, ExecSpace> decay;
  impl::chunk_states<ExecSpace, T>(op, space, args, opts, states, decay);
  out.emplace_back("decay", to_host(decay));  // (states' last row is the state pass's)
  impl::state_pass(space, states, decay, args.initial_state, kdnn::Tensor4<T, ExecSpace>());
  out.emplace_back("state_pass", to_host(states));
  impl::chunk_dstates(op, space, args, opts, dstates);
  out.emplace_back("chunk_dstates", to_host(dstates));
  impl::reverse_state_pass(space, dstates, decay, args.dfinal_state, kdnn::Tensor4<T, ExecSpace>(),
                           s.P);
  out.emplace_back("reverse_state_pass", to_host(dstates));
  auto g = impl::gradient_buffers(args);
  impl::diag_backward(op, space, args, opts, g);
  space.fence();
  // The GPU forms' first half is da_diag alone (ssd_steps.hpp).
  if (!impl::gpu_backward_form(space, args, opts, [](auto) {})) {
    out.emplace_back("diag dx", to_host(g.dx));
    out.emplace_back("diag dB", to_host(g.dBh));
    out.emplace_back("diag dC", to_host(g.dCh));
  }
  out.emplace_back("diag da", to_host(g.da_diag));
  impl::state_backward(op, space, args, opts, states, dstates, g);
  out.emplace_back("state dx", to_host(dx));
  out.emplace_back("state ddt", to_host(ddt));
  out.emplace_back("state dA", to_host(dA));
  out.emplace_back("state dB", to_host(dB));
  out.emplace_back("state dC", to_host(dC));
  impl::fused_backward(op, space, args, opts, states, dstates, impl::gradient_buffers(args, false));
  out.emplace_back("fused dx", to_host(dx));
  out.emplace_back("fused ddt", to_host(ddt));
  out.emplace_back("fused dA", to_host(dA));
  out.emplace_back("fused dB", to_host(dB));
  out.emplace_back("fused dC", to_host(dC));
  return out;
}

TEST(SsdSteps, EachStepOnTheDefaultSpaceMatchesTheHostSpace) {
  const struct {
    ssm_ref::SsdShape s;
    int chunk;
  } configs[] = {{{2, 37, 4, 8, 2, 8}, 8}, {{1, 150, 2, 64, 1, 64}, 64}};
  for (const auto& c : configs) {
    ssm_ref::SsdCase a;
    a.s = c.s;
    const auto& s = c.s;
    a.x = normal(std::size_t(s.B) * s.L * s.H * s.P, 1);
    a.dt = uniform(std::size_t(s.B) * s.L * s.H, 0.05, 0.6, 2);
    a.A = uniform(s.H, -1.5, -0.2, 3);
    a.Bm = normal(std::size_t(s.B) * s.L * s.G * s.N, 4);
    a.Cm = normal(std::size_t(s.B) * s.L * s.G * s.N, 5);
    a.dy = normal(std::size_t(s.B) * s.L * s.H * s.P, 6);
    for (const auto form : {kdnn::KernelForm::host, kdnn::KernelForm::gpu}) {
      const auto device = run_steps<Space>(a, c.chunk, form);
      const auto host = run_steps<Kokkos::DefaultHostExecutionSpace>(a, c.chunk, form);
      ASSERT_EQ(device.size(), host.size());
      for (std::size_t i = 0; i < device.size(); ++i) {
        SCOPED_TRACE(device[i].first + (form == kdnn::KernelForm::gpu ? " gpu" : " host") +
                     " P=" + std::to_string(s.P));
        EXPECT_ALLCLOSE(device[i].second, host[i].second, 1e-10, 1e-10);
      }
    }
  }
}

}  // namespace
