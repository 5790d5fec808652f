// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The SSD's state passes between chunks (ssm/impl/ssd_steps.hpp: state_pass
// and reverse_state_pass, which load kStatePassAhead chunks before storing
// any) against the recurrences written out here in double:
//   forward:  H_0 = init, H_{c+1} = d_c H_c + S_c; chunk c's row becomes H_c,
//             the extra last row and final_state H_chunks;
//   reverse:  G_chunks = dfinal, G_c = dS_c + d_c G_{c+1}; chunk c's row
//             becomes G_{c+1}, dinit G_0.
// Chunk counts around multiples of the load-ahead (0, 1, ahead − 1, ahead,
// ahead + 1, 2·ahead + 3) and a state size that is not a multiple of a host
// block (so that a block has fewer elements than its width), with and
// without the optional initial and final states.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kdnn/ssm/ssd.hpp"
#include "random.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;
namespace impl = kdnn::ssm::impl;

template <class T>
class SsdStatePass : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(SsdStatePass, Types);

constexpr int kAhead = impl::kStatePassAhead;

template <class T>
void expect_close(const std::vector<double>& got, const std::vector<double>& want,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  // Each value is a sum of at most 2·ahead + 4 terms below 1 in magnitude.
  const double bound = 64 * std::numeric_limits<T>::epsilon();
  for (std::size_t k = 0; k < got.size(); ++k) {
    ASSERT_NEAR(got[k], want[k], bound * (1 + std::fabs(want[k]))) << what << " element " << k;
  }
}

template <class T>
void check(int chunks, bool ends, unsigned seed) {
  SCOPED_TRACE("chunks=" + std::to_string(chunks) + " ends=" + std::to_string(ends));
  const int B = 2, H = 3, P = 5, N = 14, NP = N * P;  // NP = 70: one full host block and part
  const auto local = uniform(std::size_t(B) * H * (chunks + 1) * NP, -1.0, 1.0, seed);
  const auto decays = uniform(std::size_t(B) * H * chunks, 0.2, 1.0, seed + 1);
  const auto init = uniform(std::size_t(B) * H * P * N, -1.0, 1.0, seed + 2);
  const std::size_t per_state = std::size_t(P) * N;
  impl::ChunkStates<T, Space> states("states", B, H, chunks + 1, NP);
  {
    auto h = Kokkos::create_mirror_view(states);
    std::size_t k = 0;
    for (int b = 0; b < B; ++b)
      for (int hh = 0; hh < H; ++hh)
        for (int c = 0; c <= chunks; ++c)
          for (int e = 0; e < NP; ++e) h(b, hh, c, e) = T(local[k++]);
    Kokkos::deep_copy(states, h);
  }
  const auto decay = to_device<T***>(decays, B, H, chunks);
  const auto init_d = to_device<T****>(init, B, H, P, N);
  DeviceView<T****> fin("final", B, H, P, N);
  impl::state_pass(Space(), states, decay,
                   ends ? kdnn::Tensor4<const T, Space>(init_d) : kdnn::Tensor4<const T, Space>(),
                   ends ? kdnn::Tensor4<T, Space>(fin) : kdnn::Tensor4<T, Space>());
  std::vector<double> want((std::size_t(B) * H * (chunks + 1)) * NP), want_final(B * H * per_state);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < H; ++h) {
      const std::size_t bh = std::size_t(b) * H + h;
      for (int e = 0; e < NP; ++e) {
        const int p = e % P, n = e / P;
        double s = ends ? double(T(init[bh * per_state + p * N + n])) : 0.0;
        for (int c = 0; c < chunks; ++c) {
          const std::size_t at = (bh * (chunks + 1) + c) * NP + e;
          want[at] = s;
          s = double(T(decays[bh * chunks + c])) * s + double(T(local[at]));
        }
        want[(bh * (chunks + 1) + chunks) * NP + e] = s;
        want_final[bh * per_state + p * N + n] = s;
      }
    }
  }
  expect_close<T>(to_host(states), want, "forward states");
  if (ends) expect_close<T>(to_host(fin), want_final, "final state");

  // Reverse, on the first `chunks` rows of the same local values.
  impl::ChunkStates<T, Space> dstates("dstates", B, H, chunks, NP);
  {
    auto h = Kokkos::create_mirror_view(dstates);
    for (int b = 0; b < B; ++b)
      for (int hh = 0; hh < H; ++hh)
        for (int c = 0; c < chunks; ++c)
          for (int e = 0; e < NP; ++e)
            h(b, hh, c, e) = T(local[((std::size_t(b) * H + hh) * (chunks + 1) + c) * NP + e]);
    Kokkos::deep_copy(dstates, h);
  }
  DeviceView<T****> dinit("dinit", B, H, P, N);
  impl::reverse_state_pass(
      Space(), dstates, decay,
      ends ? kdnn::Tensor4<const T, Space>(init_d) : kdnn::Tensor4<const T, Space>(),
      ends ? kdnn::Tensor4<T, Space>(dinit) : kdnn::Tensor4<T, Space>(), P);
  std::vector<double> rwant(std::size_t(B) * H * chunks * NP), want_dinit(B * H * per_state);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < H; ++h) {
      const std::size_t bh = std::size_t(b) * H + h;
      for (int e = 0; e < NP; ++e) {
        const int p = e % P, n = e / P;
        double g = ends ? double(T(init[bh * per_state + p * N + n])) : 0.0;
        for (int c = chunks - 1; c >= 0; --c) {
          rwant[(bh * chunks + c) * NP + e] = g;
          g = double(T(local[(bh * (chunks + 1) + c) * NP + e])) +
              double(T(decays[bh * chunks + c])) * g;
        }
        want_dinit[bh * per_state + p * N + n] = g;
      }
    }
  }
  expect_close<T>(to_host(dstates), rwant, "reverse states");
  if (ends) expect_close<T>(to_host(dinit), want_dinit, "initial state's gradient");
}

TYPED_TEST(SsdStatePass, LoadsAheadAndMatchesTheRecurrence) {
  using T = TypeParam;
  unsigned seed = 1;
  for (int chunks : {0, 1, kAhead - 1, kAhead, kAhead + 1, 2 * kAhead + 3}) {
    for (bool ends : {false, true}) check<T>(chunks, ends, seed += 3);
  }
}

}  // namespace
