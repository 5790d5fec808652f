// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Each packed sequence's final state (SsdForward::cu_seqlens and
// sequence_states, mamba's varlen states): against the float64 recurrence
// reset at each start, read after each sequence's last step, in every
// kernel form, for sequences of 0, 1, Q − 1, Q, Q + 1 and many chunks of
// steps, ending inside chunks and on their edges, with and without an
// initial state (which belongs to the first sequence); y and the final
// state are those of the call without them, to the bit; bad offsets, an
// id sequence that disagrees with them, and the other misuses are a
// kdnn::Error naming the argument.
#include <gtest/gtest.h>

#include <string>
#include <utility>
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

/// The offsets [S + 1] of sequences of the given lengths.
Vec offsets_of(const std::vector<int>& lengths) {
  Vec cu{0};
  for (const int n : lengths) cu.push_back(cu.back() + n);
  return cu;
}

/// One batch entry of packed sequences of the given lengths; ids counted
/// from 3 (an empty sequence takes an id no step has).
SsdCase packed_case(SsdShape s, const std::vector<int>& lengths, bool with_init, unsigned seed) {
  SsdCase a;
  a.s = s;
  const std::size_t BL = std::size_t(s.B) * s.L;
  a.x = normal(BL * s.H * s.P, seed);
  a.dt = uniform(BL * s.H, 0.05, 0.6, seed + 1);
  a.A = uniform(s.H, -1.5, -0.2, seed + 2);
  a.Bm = normal(BL * s.G * s.N, seed + 3);
  a.Cm = normal(BL * s.G * s.N, seed + 4);
  a.D = uniform(s.H, -1, 1, seed + 5);
  a.dy = normal(BL * s.H * s.P, seed + 7);  // read by SsdViews, unused here
  if (with_init) a.init = normal(std::size_t(s.B) * s.H * s.P * s.N, seed + 6);
  int id = 3;
  for (const int n : lengths) {
    for (int i = 0; i < n; ++i) a.seq.push_back(id);
    ++id;
  }
  return a;
}

/// The recurrence's state after each sequence's last step [S, H, P, N]
/// (0 for an empty sequence).
Vec expected_sequence_states(const SsdCase& a, const Vec& cu) {
  const SsdShape& s = a.s;
  const std::size_t PN = std::size_t(s.P) * s.N, S = cu.size() - 1;
  Vec out(S * s.H * PN, 0.0);
  for (int h = 0; h < s.H; ++h) {
    const auto hs = ssm_ref::ssd_states(a, 0, h);  // hs[t + 1]: after step t
    for (std::size_t q = 0; q < S; ++q) {
      const auto end = std::size_t(cu[q + 1]);
      if (end == std::size_t(cu[q])) continue;
      for (std::size_t e = 0; e < PN; ++e) out[(q * s.H + h) * PN + e] = hs[end][e];
    }
  }
  return out;
}

struct Result {
  Vec y, final_state, states;
};

template <class T>
Result run(const SsdCase& a, const Vec& cu, int chunk, kdnn::KernelForm form) {
  const SsdShape& s = a.s;
  SsdViews<T> v(a);
  DeviceView<T****> y("y", s.B, s.L, s.H, s.P), fin("final", s.B, s.H, s.P, s.N);
  DeviceView<T****> states("states", cu.size() - 1, s.H, s.P, s.N);
  ssm::SsdForward<T, Space> args;
  v.set_inputs(args);
  args.y = y;
  args.final_state = fin;
  const auto offsets = to_device<int*>(cu, cu.size());
  args.cu_seqlens = offsets;
  args.sequence_states = states;
  ssm::ssd_forward(Space(), args, options(chunk, form));
  return {to_host(y), to_host(fin), to_host(states)};
}

struct PackedStates {
  SsdShape s;
  int chunk;
  std::vector<kdnn::KernelForm> forms;
  std::vector<int> lengths;
};

/// Sequences ending inside chunks and on their edges, of 0, 1, Q − 1, Q,
/// Q + 1 and several chunks of steps, a sequence first and last.
std::vector<PackedStates> packed_state_cases() {
  const auto host = kdnn::KernelForm::host, gpu = kdnn::KernelForm::gpu,
             tc = kdnn::KernelForm::tensor_cores;
  return {
      {{1, 61, 3, 5, 1, 6}, 8, {host}, {0, 1, 7, 8, 9, 0, 20, 16}},
      {{1, 30, 2, 3, 1, 4}, 64, {host}, {10, 1, 19, 0}},
      {{1, 20, 2, 4, 2, 3}, 1, {host}, {2, 1, 17}},
      {{1, 9, 2, 3, 1, 4}, 4, {host}, {9}},
      {{1, 70, 2, 64, 1, 64}, 16, {host, gpu, tc}, {1, 15, 16, 17, 21}},
  };
}

template <class T>
class SsdSequenceStates : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(SsdSequenceStates, Types);

TYPED_TEST(SsdSequenceStates, EqualTheRecurrenceAfterEachSequence) {
  using T = TypeParam;
  unsigned seed = 5200;
  for (const PackedStates& c : packed_state_cases()) {
    for (const bool with_init : {false, true}) {
      const SsdCase a = packed_case(c.s, c.lengths, with_init, seed += 10);
      const Vec cu = offsets_of(c.lengths);
      const Vec expected = expected_sequence_states(a, cu);
      for (const auto form : c.forms) {
        SCOPED_TRACE(::testing::Message()
                     << "L=" << c.s.L << " P=" << c.s.P << " N=" << c.s.N << " Q=" << c.chunk
                     << " form " << int(form) << " initial state " << with_init);
        const Result r = run<T>(a, cu, c.chunk, form);
        EXPECT_ALLCLOSE(r.states, expected, tol<T>(), sum_tol<T>(c.s.N * 4.0));
        // The outputs of the call without the states, to the bit.
        const auto plain = run_forward<T>(a, c.chunk, form);
        EXPECT_EQ(r.y, plain.y);
        EXPECT_EQ(r.final_state, plain.final_state);
      }
    }
  }
}

// No steps: every sequence is empty, and its state 0.
TEST(SsdSequenceStatesEdges, EmptySequencesOfAnEmptyBatchEntry) {
  using T = double;
  const SsdShape s{1, 0, 2, 3, 1, 4};
  for (const Vec& cu : {Vec{0}, Vec{0, 0, 0}}) {
    SsdCase a = packed_case(s, {}, true, 7);
    SsdViews<T> v(a);
    DeviceView<T****> y("y", 1, 0, s.H, s.P);
    DeviceView<T****> states("states", cu.size() - 1, s.H, s.P, s.N);
    Kokkos::deep_copy(states, T(5));
    ssm::SsdForward<T, Space> args;
    v.set_inputs(args);
    args.y = y;
    args.seq_idx = DeviceView<int**>("seq_idx", 1, 0);
    const auto offsets = to_device<int*>(cu, cu.size());
    args.cu_seqlens = offsets;
    args.sequence_states = states;
    ssm::ssd_forward(Space(), args, options(4, kdnn::KernelForm::host));
    for (const double e : to_host(states)) EXPECT_EQ(e, 0.0);
  }
}

/// Arguments of a valid call with states, on `v`'s one batch entry.
template <class T>
struct StatesCall {
  SsdViews<T> v;
  DeviceView<T****> y, states;
  DeviceView<int*> cu;
  ssm::SsdForward<T, Space> args;

  StatesCall(const SsdCase& a, const Vec& offsets)
      : v(a),
        y("y", a.s.B, a.s.L, a.s.H, a.s.P),
        states("states", offsets.size() - 1, a.s.H, a.s.P, a.s.N),
        cu(to_device<int*>(offsets, offsets.size())) {
    v.set_inputs(args);
    args.y = y;
    args.cu_seqlens = cu;
    args.sequence_states = states;
  }
};

TEST(SsdSequenceStatesErrors, MisusesAreNamed) {
  using T = double;
  const SsdShape s{1, 6, 2, 3, 1, 4};
  const SsdCase a = packed_case(s, {2, 4}, false, 11);
  const auto call = [](const ssm::SsdForward<T, Space>& args) { ssm::ssd_forward(Space(), args); };
  {
    StatesCall<T> c(a, {0, 2, 6});
    call(c.args);  // valid
    auto args = c.args;
    args.sequence_states = {};
    EXPECT_KDNN_ERROR(call(args), "cu_seqlens is given without sequence_states");
    args = c.args;
    args.cu_seqlens = {};
    EXPECT_KDNN_ERROR(call(args), "sequence_states is given without cu_seqlens");
    args = c.args;
    args.seq_idx = {};
    EXPECT_KDNN_ERROR(call(args), "cu_seqlens is given without seq_idx");
    args = c.args;
    args.sequence_states = DeviceView<T****>("states", 3, s.H, s.P, s.N);
    EXPECT_KDNN_ERROR(call(args),
                      "sequence_states has extent(0)=3, expected 2 (S, cu_seqlens' extent(0) - 1)");
    args = c.args;
    args.sequence_states = DeviceView<T****>("states", 2, s.H, s.P, s.N + 1);
    EXPECT_KDNN_ERROR(call(args), "sequence_states has extent(3)=5, expected 4 (N, B's extent(3))");
    args = c.args;
    args.cu_seqlens = DeviceView<int*>("cu", 0);
    EXPECT_KDNN_ERROR(call(args), "cu_seqlens has extent(0)=0, expected S + 1 >= 1 offsets");
    // The states over x (one sequence: 24 of x's 36 elements).
    args = c.args;
    args.sequence_states = DeviceView<T****>(c.v.x.data(), 1, s.H, s.P, s.N);
    args.cu_seqlens = to_device<int*>(Vec{0, double(s.L)}, 2);
    args.seq_idx = to_device<int**>(Vec(s.L, 1.0), 1, s.L);
    EXPECT_KDNN_ERROR(call(args), "sequence_states");
  }
  const std::vector<std::pair<Vec, std::string>> bad = {
      {{1, 2, 6}, "cu_seqlens[0]=1, expected 0"},
      {{0, 4, 2, 6}, "cu_seqlens[2]=2 < cu_seqlens[1]=4, expected offsets that never decrease"},
      {{0, 2, 5}, "cu_seqlens[2]=5, expected 6 (L, x's extent(1))"},
      // The ids change at step 2; these offsets start a sequence elsewhere.
      {{0, 3, 6},
       "seq_idx[0, 1]=3, seq_idx[0, 2]=4, expected the same id: cu_seqlens starts no "
       "sequence at step 2"},
      {{0, 2, 4, 6},
       "seq_idx[0, 3]=4, seq_idx[0, 4]=4, expected a new id: cu_seqlens starts a "
       "sequence at step 4"},
  };
  for (const auto& [offsets, message] : bad) {
    StatesCall<T> c(a, offsets);
    EXPECT_KDNN_ERROR(call(c.args), message);
  }
  // Two batch entries.
  const SsdCase two = [&] {
    SsdCase t = packed_case({2, 6, 2, 3, 1, 4}, {2, 4}, false, 13);
    t.seq.insert(t.seq.end(), t.seq.begin(), t.seq.end());
    return t;
  }();
  StatesCall<T> c(two, {0, 2, 6});
  EXPECT_KDNN_ERROR(call(c.args), "x has extent(0)=2, expected 1 with cu_seqlens");
}

}  // namespace
