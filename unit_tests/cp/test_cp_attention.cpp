// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Context-parallel fused attention (kdnn/cp/attention.hpp), run by ctest
// under mpiexec at 1, 2, 3 and 4 ranks: on every layout (contiguous splits
// with short and empty ranks, load-balanced with S not divisible by 2R,
// interleaved) and with each communication type (ring, all_gather by the
// default slice and by one head, all_to_all, all_to_all inside groups of
// every size that divides R with a ring across), each rank's O and lse
// equal the single-rank fused attention
// over the whole sequence at its steps, with the causal mask and without,
// GQA and MQA, a sliding window narrower than a segment and wider than a
// rank's share, ALiBi with a softcap, dropout, sinks, padded entries; in
// float64 to 1e-12 and float32 to its tolerance. The bytes a rank sends are
// each form's formula. The backward's dq, dk, dv (and the sinks'
// gradient, summed over the ranks) equal the single-rank backward's. The
// collective checks give every rank the same error.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "allclose.hpp"
#include "expect_error.hpp"
#include "kdnn/attention/fused_attention_varlen.hpp"
#include "kdnn/cp/cp.hpp"
#include "rank_splits.hpp"
#include "test_layouts.hpp"
#include "views.hpp"

namespace {
namespace cp_attention_test {  // one name for this file's helpers (unity builds)

using namespace kdnn_test;
namespace at = kdnn::attention;
namespace cp = kdnn::cp;
using Vec = std::vector<double>;

/// One attention problem over a whole sequence of S steps.
struct Attention {
  int B, H, Hkv, S, D;
  Vec q, k, v, dout, sinks;
  std::vector<std::int64_t> cu_seqlens;  ///< packed sequences (B = 1), or none
  at::FusedAttentionOptions opts;
  at::AttentionMask<Space> mask;

  Attention(int B_, int H_, int Hkv_, int S_, int D_) : B(B_), H(H_), Hkv(Hkv_), S(S_), D(D_) {
    q = normal(std::size_t(B) * H * S * D, 11);
    k = normal(std::size_t(B) * Hkv * S * D, 12);
    v = normal(std::size_t(B) * Hkv * S * D, 13);
    dout = normal(q.size(), 14);
    opts.scale = 1.0 / std::sqrt(double(D));
  }
};

struct Out {
  Vec o, lse, dq, dk, dv, dsinks;
  cp::ExchangeStats forward, backward;
};

/// The forward on this rank's `segments` under `layout`, or (layout null)
/// the single-rank operator on the whole sequence.
template <class T>
Out run(const Attention& a, const cp::SequenceLayout* layout,
        const std::vector<cp::Segment>& segments, const cp::CpAttentionOptions& how = {}) {
  int n = 0;
  for (const auto& s : segments) n += int(s.steps());
  const auto rows = [&](const Vec& x, int heads) {
    return local_steps(x, a.B * heads, a.S, a.D, segments);
  };
  at::FusedAttentionForward<T, Space> f;
  f.q = to_device<T****>(rows(a.q, a.H), a.B, a.H, n, a.D);
  f.k = to_device<T****>(rows(a.k, a.Hkv), a.B, a.Hkv, n, a.D);
  f.v = to_device<T****>(rows(a.v, a.Hkv), a.B, a.Hkv, n, a.D);
  DeviceView<T****> o("o", a.B, a.H, n, a.D);
  DeviceView<T***> lse("lse", a.B, a.H, n);
  f.o = o, f.lse = lse, f.mask = a.mask;
  if (!a.sinks.empty()) f.sinks = to_device<T*>(a.sinks, a.H);
  at::FusedAttentionBackward<T, Space> g;
  g.q = f.q, g.k = f.k, g.v = f.v, g.o = o, g.lse = lse, g.mask = a.mask, g.sinks = f.sinks;
  g.dout = to_device<T****>(rows(a.dout, a.H), a.B, a.H, n, a.D);
  DeviceView<T****> dq("dq", a.B, a.H, n, a.D), dk("dk", a.B, a.Hkv, n, a.D),
      dv("dv", a.B, a.Hkv, n, a.D);
  DeviceView<T*> dsinks;
  if (!a.sinks.empty()) dsinks = DeviceView<T*>("dsinks", a.H);
  g.dq = dq, g.dk = dk, g.dv = dv, g.dsinks = dsinks;
  Out out;
  if (layout) {
    auto packed = how;
    packed.cu_seqlens = a.cu_seqlens;
    out.forward = cp::fused_attention_forward(Space(), MPI_COMM_WORLD, *layout, f, a.opts, packed);
    out.backward =
        cp::fused_attention_backward(Space(), MPI_COMM_WORLD, *layout, g, a.opts, packed);
    if (!a.sinks.empty()) cp::allreduce_sum(MPI_COMM_WORLD, dsinks);
  } else if (!a.cu_seqlens.empty()) {         // the single-rank packed call on the same memory
    const auto packed = [&](const auto& t) {  // [1, heads, S, E] as [S, heads, E]
      using V = Kokkos::View<typename std::remove_reference_t<decltype(t)>::value_type***,
                             Kokkos::LayoutStride, Space>;
      return V(t.data(), Kokkos::LayoutStride(t.extent(2), t.stride(2), t.extent(1), t.stride(1),
                                              t.extent(3), t.stride(3)));
    };
    Vec offsets(a.cu_seqlens.begin(), a.cu_seqlens.end());
    const at::PackedSequences<Space> seqs{to_device<int*>(offsets, offsets.size()),
                                          to_device<int*>(offsets, offsets.size())};
    const kdnn::Matrix<T, Space> lse_ht(lse.data(), a.H, n);
    at::fused_attention_varlen_forward(
        Space(),
        at::FusedAttentionVarlenForward<T, Space>{packed(f.q), packed(f.k), packed(f.v), packed(o),
                                                  lse_ht, seqs, a.mask, f.sinks},
        a.opts);
    at::fused_attention_varlen_backward(
        Space(),
        at::FusedAttentionVarlenBackward<T, Space>{
            packed(g.q), packed(g.k), packed(g.v), packed(g.o), lse_ht, packed(g.dout), packed(dq),
            packed(dk), packed(dv), seqs, a.mask, g.sinks, dsinks},
        a.opts);
  } else {
    at::fused_attention_forward(Space(), f, a.opts);
    at::fused_attention_backward(Space(), g, a.opts);
  }
  out.o = to_host(o), out.lse = to_host(lse);
  out.dq = to_host(dq), out.dk = to_host(dk), out.dv = to_host(dv);
  if (!a.sinks.empty()) out.dsinks = to_host(dsinks);
  for (double& x : out.lse) x = x == -std::numeric_limits<double>::infinity() ? -1e300 : x;
  return out;
}

/// The groups of `size` consecutive ranks of MPI_COMM_WORLD (freed with it).
struct Groups {
  MPI_Comm comm = MPI_COMM_NULL;
  explicit Groups(int size) {
    MPI_Comm_split(MPI_COMM_WORLD, comm_rank() / size, comm_rank(), &comm);
  }
  ~Groups() { MPI_Comm_free(&comm); }
  Groups(const Groups&) = delete;
  Groups& operator=(const Groups&) = delete;
};

/// Each communication type with a name: the all_gather also one K/V head
/// at a time, and the two-level form on each of `grids`.
std::vector<std::pair<std::string, cp::CpAttentionOptions>> comm_types(
    const std::vector<std::unique_ptr<Groups>>& grids) {
  using C = cp::AttentionComm;
  std::vector<std::pair<std::string, cp::CpAttentionOptions>> out = {
      {"ring", {C::ring, 0}},
      {"all_gather", {C::all_gather, 0}},
      {"all_gather by 1 head", {C::all_gather, 1}},
      {"all_to_all", {C::all_to_all, 0}}};
  for (const auto& g : grids) {
    int size = 0;
    MPI_Comm_size(g->comm, &size);
    out.push_back({"all_to_all in groups of " + std::to_string(size) + ", ring across",
                   {C::all_to_all_ring, 0, g->comm}});
  }
  return out;
}

/// The bytes a rank sends in the forward and the backward of `how`, from
/// each form's description (cp/attention.hpp), per value of T.
std::pair<std::int64_t, std::int64_t> values_sent(const Attention& a, const cp::SequenceLayout& l,
                                                  cp::AttentionComm how) {
  const int R = l.ranks(), rank = comm_rank();
  const std::int64_t rows = std::int64_t(a.B) * a.Hkv * 2 * a.D;  // a K/V step of every head
  const std::int64_t mine = l.local_steps(rank), S = a.S;
  std::int64_t forward = 0, backward = 0;
  if (how == cp::AttentionComm::ring) {
    // R − 1 blocks leave each rank: its own, then each it received but the
    // last; in the backward again, with R gradients (each block's, as it
    // leaves this rank).
    for (int s = 0; s < R; ++s) {
      const std::int64_t block = rows * l.local_steps((rank + R - s) % R);
      if (s + 1 < R) forward += block;
      if (R > 1) backward += block;
    }
    backward += forward;
  } else if (how == cp::AttentionComm::all_gather) {
    forward = (R - 1) * rows * mine;         // its own K/V to every other rank
    backward = forward + rows * (S - mine);  // and the others' rows of dK/dV
  } else {
    // Rank d computes query heads [qb(d), qb(d + 1)) and the K/V heads
    // they read; a rank sends each other rank its steps of those heads, and
    // gets back O and lse (forward) or dQ, dK, dV (backward) at its steps.
    const auto qb = [&](int d) { return d * (a.H / R) + std::min(d, a.H % R); };
    const int g = a.H / a.Hkv;
    const auto heads = [&](int d) { return qb(d + 1) - qb(d); };
    const auto kv_heads = [&](int d) { return heads(d) ? (qb(d + 1) - 1) / g - qb(d) / g + 1 : 0; };
    for (int d = 0; d < R; ++d) {
      if (d == rank) continue;
      const std::int64_t qkv = a.B * mine * (heads(d) * a.D + kv_heads(d) * 2 * a.D);
      forward += qkv + a.B * l.local_steps(d) * heads(rank) * (a.D + 1);
      backward += qkv + a.B * mine * heads(d) * (2 * a.D + 1) +
                  a.B * l.local_steps(d) * (heads(rank) * a.D + kv_heads(rank) * 2 * a.D);
    }
  }
  return {forward, backward};
}

template <class T>
void expect_equal_to_single_rank(const Attention& a, double tol) {
  const int R = comm_size(), rank = comm_rank();
  const Out whole = run<T>(a, nullptr, {{0, a.S}});
  std::vector<std::unique_ptr<Groups>> grids;  // every split of the ranks into groups
  for (int size = 1; size <= R; ++size) {
    if (R % size == 0) grids.push_back(std::make_unique<Groups>(size));
  }
  for (const auto& named : test_layouts(R, a.S, 2)) {
    for (const auto& [how_name, how] : comm_types(grids)) {
      const auto& segments = named.layout.segments(rank);
      SCOPED_TRACE(named.name + ", " + how_name + ", rank " + std::to_string(rank) +
                   " S=" + std::to_string(a.S));
      const Out part = run<T>(a, &named.layout, segments, how);
      EXPECT_ALLCLOSE(part.o, local_steps(whole.o, a.B * a.H, a.S, a.D, segments), tol, tol);
      EXPECT_ALLCLOSE(part.lse, local_steps(whole.lse, a.B * a.H, a.S, 1, segments), tol, tol);
      const double gtol = 10 * tol;  // sums of more terms, in another order
      EXPECT_ALLCLOSE(part.dq, local_steps(whole.dq, a.B * a.H, a.S, a.D, segments), gtol, gtol);
      EXPECT_ALLCLOSE(part.dk, local_steps(whole.dk, a.B * a.Hkv, a.S, a.D, segments), gtol, gtol);
      EXPECT_ALLCLOSE(part.dv, local_steps(whole.dv, a.B * a.Hkv, a.S, a.D, segments), gtol, gtol);
      EXPECT_ALLCLOSE(part.dsinks, whole.dsinks, gtol, gtol);
      if (how.comm == cp::AttentionComm::all_to_all_ring) continue;  // its parts' are below
      const auto [forward, backward] = values_sent(a, named.layout, how.comm);
      EXPECT_EQ(part.forward.bytes_sent, forward * std::int64_t(sizeof(T)));
      EXPECT_EQ(part.backward.bytes_sent, backward * std::int64_t(sizeof(T)));
    }
  }
}

TEST(CpAttention, EqualsSingleRankOnEveryLayout) {
  Attention causal(2, 4, 2, 29, 8);
  causal.mask.causal = true;
  expect_equal_to_single_rank<double>(causal, 1e-12);
  expect_equal_to_single_rank<float>(causal, 2e-5);
  Attention full(1, 3, 1, 17, 8);  // MQA, no mask
  expect_equal_to_single_rank<double>(full, 1e-12);
  Attention cut(1, 6, 2, 13, 4);  // groups of 3 heads: the all_to_all cuts them at 4 ranks
  cut.mask.causal = true;
  expect_equal_to_single_rank<double>(cut, 1e-12);
}

TEST(CpAttention, WindowsAlibiSoftcapDropoutSinksAndPaddingEqualSingleRank) {
  Attention window(1, 2, 2, 31, 8);
  window.mask.band_left = 2, window.mask.band_right = 0;  // narrower than a segment
  expect_equal_to_single_rank<double>(window, 1e-12);
  window.mask.band_left = 20;  // wider than a rank's share
  expect_equal_to_single_rank<double>(window, 1e-12);
  Attention biased(2, 4, 2, 23, 8);
  biased.mask.causal = true;
  biased.mask.alibi_slopes = to_device<double**>({0.5, 0.25, 0.125, 0.0625}, 1, 4);
  biased.opts.softcap = 4.0;
  biased.opts.dropout = {0.2, 77, 3};
  biased.sinks = {0.3, -1.0, 2.0, -std::numeric_limits<double>::infinity()};
  expect_equal_to_single_rank<double>(biased, 1e-12);
  Attention padded(2, 2, 1, 21, 8);
  padded.mask.causal = true;
  padded.mask.seq_q = to_device<int*>({14, 21}, 2);
  padded.mask.seq_k = to_device<int*>({9, 21}, 2);
  expect_equal_to_single_rank<double>(padded, 1e-12);
}

// Packed sequences (cu_seqlens over the whole sequence, an empty one among
// them) whose boundaries fall on rank edges and inside chunks: every form
// equals the single-rank packed call, with the causal mask, a window, and
// ALiBi with one row of slopes per sequence, dropout and sinks.
TEST(CpAttention, PackedSequencesEqualTheSingleRankPackedCall) {
  Attention causal(1, 4, 2, 29, 8);
  causal.cu_seqlens = {0, 5, 6, 13, 13, 22, 29};
  causal.mask.causal = true;
  expect_equal_to_single_rank<double>(causal, 1e-12);
  expect_equal_to_single_rank<float>(causal, 2e-5);
  Attention window = causal;
  window.mask.causal = false;
  window.mask.band_left = 3, window.mask.band_right = 1;
  expect_equal_to_single_rank<double>(window, 1e-12);
  Attention biased(1, 2, 1, 26, 8);
  biased.cu_seqlens = {0, 7, 8, 20, 26};
  biased.mask.causal = true;
  biased.mask.alibi_slopes =
      to_device<double**>({0.5, 0.25, 0.125, 1.0, 0.75, 0.0625, 0.3, 0.2}, 4, 2);
  biased.opts.dropout = {0.2, 5, 9};
  biased.sinks = {0.4, -0.5};
  expect_equal_to_single_rank<double>(biased, 1e-12);
}

TEST(CpAttention, BadOrMismatchedArgumentsGiveEveryRankTheSameError) {
  const int R = comm_size(), rank = comm_rank(), odd = R - 1;
  const std::string on_odd = " (on rank " + std::to_string(odd) + " of " + std::to_string(R) + ")";
  const int n = 4, S = n * R;
  const auto layout = cp::SequenceLayout::load_balanced(S, R);
  const int mine = int(layout.local_steps(rank));
  const auto args = [&](int steps, int D) {
    at::FusedAttentionForward<double, Space> f;
    f.q = DeviceView<double****>("q", 1, 2, steps, D);
    f.k = DeviceView<double****>("k", 1, 1, steps, D);
    f.v = DeviceView<double****>("v", 1, 1, steps, D);
    f.o = DeviceView<double****>("o", 1, 2, steps, D);
    f.lse = DeviceView<double***>("lse", 1, 2, steps);
    return f;
  };
  const auto call = [&](const cp::SequenceLayout& l,
                        const at::FusedAttentionForward<double, Space>& f,
                        const at::FusedAttentionOptions& o = {}) {
    return error_of([&] { cp::fused_attention_forward(Space(), MPI_COMM_WORLD, l, f, o); });
  };
  EXPECT_EQ(call(layout, args(mine, 4)), "");
  EXPECT_EQ(call(layout, args(rank == odd ? mine + 1 : mine, 4)),
            "cp::fused_attention_forward: q has extent(2)=" +
                std::to_string(layout.local_steps(odd) + 1) + ", expected " +
                std::to_string(layout.local_steps(odd)) + " (the layout's steps on this rank)" +
                on_odd);
  if (R > 1) {
    EXPECT_EQ(call(layout, args(mine, rank == odd ? 8 : 4)),
              "cp::fused_attention_forward: D=8 on rank " + std::to_string(odd) +
                  ", expected 4 (as on rank 0; every rank must agree)");
    at::FusedAttentionOptions scaled;
    if (rank == odd) scaled.scale = 0.5;
    EXPECT_EQ(call(layout, args(mine, 4), scaled),
              "cp::fused_attention_forward: opts.scale=0.5 on rank " + std::to_string(odd) +
                  ", expected 1 (as on rank 0; every rank must agree)");
  }
  auto windowed = args(mine, 4);
  if (rank == odd) windowed.mask.hi_win = DeviceView<int*>("hi", mine);
  EXPECT_EQ(call(layout, windowed),
            "cp::fused_attention_forward: mask.hi_win given, expected none (a window per query of "
            "the rank's own keys; use the band)" +
                on_odd);
  auto padded = args(mine, 4);
  padded.mask.seq_k = to_device<int*>({double(S + 1)}, 1);
  EXPECT_EQ(call(layout, padded),
            "cp::fused_attention_forward: mask.seq_k[0]=" + std::to_string(S + 1) +
                ", expected a value in [0, " + std::to_string(S) +
                "] (key length, Sk) (on rank 0 of " + std::to_string(R) + ")");
  cp::CpAttentionOptions how;
  how.comm = rank == odd ? cp::AttentionComm::all_to_all : cp::AttentionComm::ring;
  if (R > 1) {
    EXPECT_EQ(error_of([&] {
                cp::fused_attention_forward(Space(), MPI_COMM_WORLD, layout, args(mine, 4), {},
                                            how);
              }),
              "cp::fused_attention_forward: comm=2 on rank " + std::to_string(odd) +
                  ", expected 0 (as on rank 0; every rank must agree)");
  }
  how = {cp::AttentionComm::all_gather, rank == odd ? -1 : 0};
  EXPECT_EQ(error_of([&] {
              cp::fused_attention_forward(Space(), MPI_COMM_WORLD, layout, args(mine, 4), {}, how);
            }),
            "cp::fused_attention_forward: cp_opts.gather_kv_heads=-1, expected 0 (automatic) or "
            "a number of K/V heads >= 1" +
                on_odd);
  how = {cp::AttentionComm::all_to_all_ring};
  EXPECT_EQ(error_of([&] {
              cp::fused_attention_forward(Space(), MPI_COMM_WORLD, layout, args(mine, 4), {}, how);
            }),
            "cp::fused_attention_forward: cp_opts.heads_comm is not given (or not an "
            "intracommunicator), expected this rank's group for all_to_all_ring (on rank 0 of " +
                std::to_string(R) + ")");
  how = {};
  how.cu_seqlens = {0, 3, std::int64_t(S) - 1};
  EXPECT_EQ(error_of([&] {
              cp::fused_attention_forward(Space(), MPI_COMM_WORLD, layout, args(mine, 4), {}, how);
            }),
            "cp::fused_attention_forward: cp_opts.cu_seqlens has 3 offsets from 0 to " +
                std::to_string(S - 1) + ", expected N + 1 >= 2 offsets from 0 to S=" +
                std::to_string(S) + " (on rank 0 of " + std::to_string(R) + ")");
  how.cu_seqlens = {0, 2, 1, std::int64_t(S)};
  EXPECT_EQ(error_of([&] {
              cp::fused_attention_forward(Space(), MPI_COMM_WORLD, layout, args(mine, 4), {}, how);
            }),
            "cp::fused_attention_forward: cp_opts.cu_seqlens[2]=1 < cu_seqlens[1]=2, expected "
            "offsets that never decrease (on rank 0 of " +
                std::to_string(R) + ")");
  // After the errors, a good call still works on every rank.
  EXPECT_EQ(call(layout, args(mine, 4)), "");
}

}  // namespace cp_attention_test
}  // namespace
