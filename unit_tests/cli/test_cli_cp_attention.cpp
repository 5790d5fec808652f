// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// `kdnn cp-attention` as a subprocess under mpiexec: o, lse and the
// gradients (dsinks summed over the ranks) equal double loops of softmax
// attention with sinks on the load-balanced layout (ring and all-to-all)
// and on an uneven contiguous split with an empty rank (all-gather, a
// band); forward only writes only the forward's files; bad input fails on
// every rank with one error line and leaves --out untouched.
#ifdef KDNN_MPIEXEC
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "allclose.hpp"
#include "cli_fixture.hpp"
#include "random.hpp"

namespace {

using kdnn::io::DType;
using kdnn_test::CliTest;
using kdnn_test::mpiexec;
using kdnn_test::Strings;
using Vec = std::vector<double>;

/// Attention in flash-attn's layout, q [B, S, H, D], k and v [B, S, Hkv, D],
/// with a sink logit per head, by double loops: o and lse [B, H, S], and
/// from dout the gradients.
struct Reference {
  static constexpr std::size_t B = 2, S = 13, H = 4, Hkv = 2, D = 8;
  Vec q, k, v, dout, sinks;
  bool causal = true;
  int left = -1, right = -1;  ///< the band

  Vec o, lse, dq, dk, dv, dsinks;

  static std::size_t at(std::size_t b, std::size_t t, std::size_t h, std::size_t heads) {
    return ((b * S + t) * heads + h) * D;
  }
  bool visible(std::size_t i, std::size_t j) const {
    const long d = long(j) - long(i);
    return !(causal && d > 0) && !(left >= 0 && d < -left) && !(right >= 0 && d > right);
  }
  void run() {
    o.assign(B * S * H * D, 0.0), lse.assign(B * H * S, 0.0), dq.assign(B * S * H * D, 0.0);
    dk.assign(B * S * Hkv * D, 0.0), dv.assign(B * S * Hkv * D, 0.0), dsinks.assign(H, 0.0);
    const double scale = 1 / std::sqrt(double(D));
    for (std::size_t b = 0; b < B; ++b) {
      for (std::size_t h = 0; h < H; ++h) {
        const std::size_t g = h / (H / Hkv);
        for (std::size_t i = 0; i < S; ++i) {
          Vec s(S, -INFINITY);
          double m = sinks[h];
          for (std::size_t j = 0; j < S; ++j) {
            if (!visible(i, j)) continue;
            s[j] = 0;
            for (std::size_t e = 0; e < D; ++e)
              s[j] += q[at(b, i, h, H) + e] * k[at(b, j, g, Hkv) + e];
            s[j] *= scale;
            m = std::max(m, s[j]);
          }
          double z = std::exp(sinks[h] - m);
          for (std::size_t j = 0; j < S; ++j) z += std::exp(s[j] - m);
          const double l = m + std::log(z);
          lse[(b * H + h) * S + i] = l;
          Vec p(S), dp(S);
          double delta = 0;
          for (std::size_t j = 0; j < S; ++j) {
            p[j] = std::exp(s[j] - l);
            for (std::size_t e = 0; e < D; ++e) {
              o[at(b, i, h, H) + e] += p[j] * v[at(b, j, g, Hkv) + e];
              dp[j] += dout[at(b, i, h, H) + e] * v[at(b, j, g, Hkv) + e];
            }
            delta += p[j] * dp[j];
          }
          dsinks[h] -= std::exp(sinks[h] - l) * delta;
          for (std::size_t j = 0; j < S; ++j) {
            const double ds = p[j] * (dp[j] - delta) * scale;
            for (std::size_t e = 0; e < D; ++e) {
              dq[at(b, i, h, H) + e] += ds * k[at(b, j, g, Hkv) + e];
              dk[at(b, j, g, Hkv) + e] += ds * q[at(b, i, h, H) + e];
              dv[at(b, j, g, Hkv) + e] += p[j] * dout[at(b, i, h, H) + e];
            }
          }
        }
      }
    }
  }
};

class CliCpAttention : public CliTest {
 protected:
  using R = Reference;
  Reference ref_;

  void write_problem(bool backward) {
    ref_.q = kdnn_test::normal(R::B * R::S * R::H * R::D, 1);
    ref_.k = kdnn_test::normal(R::B * R::S * R::Hkv * R::D, 2);
    ref_.v = kdnn_test::normal(R::B * R::S * R::Hkv * R::D, 3);
    ref_.dout = kdnn_test::normal(R::B * R::S * R::H * R::D, 4);
    ref_.sinks = kdnn_test::normal(R::H, 5);
    write("q.npy", DType::f64, {R::B, R::S, R::H, R::D}, ref_.q);
    write("k.npy", DType::f64, {R::B, R::S, R::Hkv, R::D}, ref_.k);
    write("v.npy", DType::f64, {R::B, R::S, R::Hkv, R::D}, ref_.v);
    write("sinks.npy", DType::f64, {R::H}, ref_.sinks);
    if (backward) write("dout.npy", DType::f64, {R::B, R::S, R::H, R::D}, ref_.dout);
  }
  Strings args(Strings extra) const {
    Strings a = {"cp-attention", "--in", in_.string(), "--out", out_.string()};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  void expect_reference(bool backward) {
    ref_.run();
    const double tol = 1e-12;
    EXPECT_ALLCLOSE(read(out_ / "o.npy", DType::f64, {R::B, R::S, R::H, R::D}), ref_.o, tol, tol);
    EXPECT_ALLCLOSE(read(out_ / "lse.npy", DType::f64, {R::B, R::H, R::S}), ref_.lse, tol, tol);
    if (!backward) return;
    EXPECT_ALLCLOSE(read(out_ / "dq.npy", DType::f64, {R::B, R::S, R::H, R::D}), ref_.dq, tol, tol);
    EXPECT_ALLCLOSE(read(out_ / "dk.npy", DType::f64, {R::B, R::S, R::Hkv, R::D}), ref_.dk, tol,
                    tol);
    EXPECT_ALLCLOSE(read(out_ / "dv.npy", DType::f64, {R::B, R::S, R::Hkv, R::D}), ref_.dv, tol,
                    tol);
    EXPECT_ALLCLOSE(read(out_ / "dsinks.npy", DType::f64, {R::H}), ref_.dsinks, tol, tol);
  }
};

TEST_F(CliCpAttention, LoadBalancedRingAndAllToAllEqualTheDoubleLoops) {
  write_problem(true);
  for (const std::string comm : {"ring", "all_to_all"}) {
    SCOPED_TRACE(comm);
    const auto r = run(args({"--causal", "--layout", "load_balanced", "--comm", comm}), mpiexec(3));
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.err, "");
    EXPECT_EQ(r.out.rfind("cp-attention: B=2 S=13 H=4 Hkv=2 D=8 Dv=8 float64, 3 rank(s), "
                          "load_balanced layout, " +
                              comm,
                          0),
              0u)
        << r.out;
    expect_reference(true);
  }
}

TEST_F(CliCpAttention, UnevenSplitAllGatherWithABandEqualsTheDoubleLoops) {
  write_problem(false);
  ref_.causal = false, ref_.left = 3, ref_.right = 1;
  const auto r =
      run(args({"--band", "3,1", "--comm", "all_gather", "--split", "2,0,11"}), mpiexec(3));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(files(out_), (std::set<std::string>{"o.npy", "lse.npy"}));
  expect_reference(false);
}

TEST_F(CliCpAttention, BadInputFailsOnEveryRankAndWritesNothing) {
  write_problem(true);
  expect_mpi_failure(args({"--layout", "load_balanced", "--split", "13,0"}), 2,
                     "--split is for --layout contiguous, not load_balanced", 2);
  expect_mpi_failure(args({"--band", "3"}), 2, "--band: expected LEFT,RIGHT, got '3'", 2);
  write("k.npy", DType::f64, {R::B, R::S, 3, R::D}, Vec(R::B * R::S * 3 * R::D, 0.0));
  write("v.npy", DType::f64, {R::B, R::S, 3, R::D}, Vec(R::B * R::S * 3 * R::D, 0.0));
  expect_mpi_failure(args({}), 1, "k.npy has Hkv=3 heads, expected a divisor of q.npy's H=4", 2);
}

}  // namespace
#endif
