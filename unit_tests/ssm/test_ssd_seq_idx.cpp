// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The SSD over packed sequences (seq_idx): against the float64 recurrence
// whose state is reset at each sequence start (ssd_reference.hpp), forward
// and backward, in every kernel form, for sequences of lengths 0 (an id
// without steps), 1, Q − 1, Q, Q + 1 and long, starting inside chunks and on
// their edges; the decays across a start are 0 exactly: an earlier sequence
// does not reach a later one's outputs by a single bit, and a later
// sequence's gradients do not reach an earlier one's inputs; bad seq_idx.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "allclose.hpp"
#include "expect_error.hpp"
#include "kdnn/ssm/ssd.hpp"
#include "random.hpp"
#include "ssd_reference.hpp"
#include "ssd_runs.hpp"
#include "ssd_views.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;
using ssm_ref::SsdCase;
using ssm_ref::SsdShape;
using ssm_ref::Vec;
namespace ssm = kdnn::ssm;

/// ids [B, L] from each batch entry's sequence lengths (a 0 skips an id);
/// every row's lengths sum to L.
Vec packed_ids(const std::vector<std::vector<int>>& lengths) {
  Vec seq;
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    int id = 100 * int(b) - 7;  // any ids: negative, not from 0
    for (const int n : lengths[b]) {
      for (int i = 0; i < n; ++i) seq.push_back(id);
      ++id;
    }
  }
  return seq;
}

SsdCase make_seq_idx_case(SsdShape s, const Vec& seq, unsigned seed) {
  SsdCase a;
  a.s = s;
  const std::size_t nx = std::size_t(s.B) * s.L * s.H * s.P;
  const std::size_t nbc = std::size_t(s.B) * s.L * s.G * s.N;
  const std::size_t ns = std::size_t(s.B) * s.H * s.P * s.N;
  a.x = normal(nx, seed);
  a.dt = uniform(std::size_t(s.B) * s.L * s.H, 0.05, 0.6, seed + 1);
  a.A = uniform(s.H, -1.5, -0.2, seed + 2);
  a.Bm = normal(nbc, seed + 3);
  a.Cm = normal(nbc, seed + 4);
  a.dy = normal(nx, seed + 5);
  a.D = uniform(s.H, -1, 1, seed + 6);
  a.init = normal(ns, seed + 7);
  a.dfinal = normal(ns, seed + 8);
  a.seq = seq;
  return a;
}

/// A shape, a chunk size, the forms to run and each row's sequence lengths.
struct Packed {
  SsdShape s;
  int chunk;
  std::vector<kdnn::KernelForm> forms;
  std::vector<std::vector<int>> lengths;
};

/// Q = 8 on the host form (small P, N); Q = 16 on every form at the GPU
/// forms' sizes: starts inside chunks and on their edges, sequences of 1,
/// Q − 1, Q, Q + 1 steps and longer, an id without steps, a row of one
/// sequence.
std::vector<Packed> packed_cases() {
  const auto host = kdnn::KernelForm::host, gpu = kdnn::KernelForm::gpu,
             tc = kdnn::KernelForm::tensor_cores;
  return {
      {{2, 45, 4, 5, 2, 6}, 8, {host}, {{1, 7, 0, 8, 9, 20}, {3, 8, 8, 1, 1, 24}}},
      {{1, 30, 2, 3, 1, 4}, 64, {host}, {{10, 1, 19}}},
      {{1, 20, 2, 4, 2, 3}, 1, {host}, {{2, 1, 17}}},
      {{2, 70, 2, 64, 1, 64}, 16, {host, gpu, tc}, {{1, 15, 16, 17, 21}, {70}}},
  };
}

template <class T>
class SsdSeqIdx : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(SsdSeqIdx, Types);

TYPED_TEST(SsdSeqIdx, MatchesTheRecurrenceResetAtEachStart) {
  using T = TypeParam;
  unsigned seed = 4100;
  for (const Packed& c : packed_cases()) {
    const SsdShape& s = c.s;
    const SsdCase a = make_seq_idx_case(s, packed_ids(c.lengths), seed += 10);
    for (const auto form : c.forms) {
      SCOPED_TRACE(::testing::Message() << "L=" << s.L << " P=" << s.P << " N=" << s.N
                                        << " Q=" << c.chunk << " form " << int(form));
      // The tensor cores' float32 products: 3×TF32, float32 accuracy.
      expect_recurrence<T>(a, run_forward<T>(a, c.chunk, form), run_backward<T>(a, c.chunk, form));
    }
  }
}

/// Multiplies the inputs of steps [0, n) of every batch entry (x, B, C by
/// `f`, dt by a factor of its own, kept in the positive range) and the
/// initial state by `f`.
SsdCase perturb_first_steps(SsdCase a, int n, double f) {
  const auto& s = a.s;
  for (int b = 0; b < s.B; ++b) {
    for (int t = 0; t < n; ++t) {
      const std::size_t bt = std::size_t(b) * s.L + t;
      for (int e = 0; e < s.H * s.P; ++e) a.x[bt * s.H * s.P + e] *= f;
      for (int e = 0; e < s.G * s.N; ++e) {
        a.Bm[bt * s.G * s.N + e] *= f;
        a.Cm[bt * s.G * s.N + e] *= f;
      }
      for (int h = 0; h < s.H; ++h) a.dt[bt * s.H + h] *= 1.7;
    }
  }
  for (double& v : a.init) v *= f;
  return a;
}

// Every decay across a start is 0 exactly: with the first sequence of each
// row changed (its inputs and the initial state scaled), the later
// sequences' outputs and the final state are the same to the bit; and with
// dy zero outside the last sequence, no gradient reaches the steps of the
// others or the initial state (exact zeros), in every form.
TYPED_TEST(SsdSeqIdx, NoDecayCrossesAStart) {
  using T = TypeParam;
  const SsdShape s{2, 70, 2, 64, 1, 64};
  const int first = 21;  // the first sequence: 21 steps, across a chunk edge
  const Vec seq = packed_ids({{first, 13, 36}, {first, 49}});
  SsdCase a = make_seq_idx_case(s, seq, 4300);
  const SsdCase changed = perturb_first_steps(a, first, 3.0);
  for (const auto form :
       {kdnn::KernelForm::host, kdnn::KernelForm::gpu, kdnn::KernelForm::tensor_cores}) {
    SCOPED_TRACE(::testing::Message() << "form " << int(form));
    const auto f = run_forward<T>(a, 16, form), fc = run_forward<T>(changed, 16, form);
    const std::size_t row = std::size_t(s.L) * s.H * s.P, later = std::size_t(first) * s.H * s.P;
    for (int b = 0; b < s.B; ++b) {
      for (std::size_t e = later; e < row; ++e) {
        ASSERT_EQ(f.y[b * row + e], fc.y[b * row + e])
            << "y, batch entry " << b << ", element " << e;
      }
    }
    EXPECT_EQ(f.final_state, fc.final_state);

    // dy only on each row's last sequence (and d(final state)).
    SsdCase last_only = a;
    for (int b = 0; b < s.B; ++b) {
      const int start = b == 0 ? first + 13 : first;
      for (std::size_t e = 0; e < std::size_t(start) * s.H * s.P; ++e)
        last_only.dy[b * row + e] = 0;
    }
    const auto g = run_backward<T>(last_only, 16, form);
    for (int b = 0; b < s.B; ++b) {
      const int start = b == 0 ? first + 13 : first;
      for (int t = 0; t < start; ++t) {
        const std::size_t bt = std::size_t(b) * s.L + t;
        for (int e = 0; e < s.H * s.P; ++e) ASSERT_EQ(g.dx[bt * s.H * s.P + e], 0.0) << t;
        for (int e = 0; e < s.G * s.N; ++e) {
          ASSERT_EQ(g.dB[bt * s.G * s.N + e], 0.0) << t;
          ASSERT_EQ(g.dC[bt * s.G * s.N + e], 0.0) << t;
        }
        for (int h = 0; h < s.H; ++h) ASSERT_EQ(g.ddt[bt * s.H + h], 0.0) << t;
      }
    }
    for (const double v : g.dinit) ASSERT_EQ(v, 0.0);
  }
}

// seq_idx of the wrong shape is a kdnn::Error naming it.
TEST(SsdSeqIdxErrors, ShapeIsChecked) {
  using T = double;
  const SsdShape s{2, 6, 2, 3, 1, 4};
  SsdCase a = make_seq_idx_case(s, {}, 1);
  SsdViews<T> v(a);
  DeviceView<T****> y("y", s.B, s.L, s.H, s.P);
  ssm::SsdForward<T, Space> args;
  v.set_inputs(args);
  args.y = y;
  args.seq_idx = DeviceView<int**>("seq_idx", s.B, s.L + 1);
  EXPECT_KDNN_ERROR(ssm::ssd_forward(Space(), args),
                    "seq_idx has extent(1)=7, expected 6 (L, x's extent(1))");
  args.seq_idx = DeviceView<int**>("seq_idx", 1, s.L);
  EXPECT_KDNN_ERROR(ssm::ssd_forward(Space(), args),
                    "seq_idx has extent(0)=1, expected 2 (B, x's extent(0))");
}

}  // namespace
