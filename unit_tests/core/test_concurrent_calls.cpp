// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// kdnn's calls from several threads at once (docs/api.md, "Threads"): each
// thread runs an operator over and over on its own inputs, and every result
// must equal, bitwise, what the same call gives when it runs alone. The
// operators are those whose kernels use team scratch and reductions, which
// Kokkos keeps per backend or per instance. The last test calls from a thread
// that has done nothing with Kokkos before.
#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <exception>
#include <initializer_list>
#include <string>
#include <thread>
#include <vector>

#include "kdnn/attention/fused_attention.hpp"
#include "kdnn/core/impl/openmp_thread_pool.hpp"
#include "kdnn/sinkhorn/sinkhorn.hpp"
#include "kdnn/ssm/causal_conv1d.hpp"
#include "kdnn/ssm/ssd.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;

constexpr int kThreads = 4;
constexpr int kRepeats = 6;

/// `run(t)` (thread t's call on its own inputs, returning its outputs) alone,
/// then from kThreads threads at once, kRepeats times each: the number of
/// concurrent results that differ from the lone one.
template <class Run>
int mismatches_under_threads(const Run& run) {
  std::vector<std::vector<double>> alone;
  for (int t = 0; t < kThreads; ++t) alone.push_back(run(t));
  std::atomic<int> wrong{0};
  std::atomic<int> ready{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t) {
    pool.emplace_back([&, t] {
      // The calls' inputs and outputs are made on the thread: on Kokkos 3.4's
      // OpenMP backend, a thread needs a pool of its own for that (kdnn's
      // calls make it themselves; a View made before the first call needs it
      // first).
      kdnn::impl::ensure_openmp_pool_on_this_thread();
      ++ready;
      while (ready.load() < kThreads) std::this_thread::yield();  // start together
      for (int r = 0; r < kRepeats; ++r) {
        if (run(t) != alone[std::size_t(t)]) ++wrong;
      }
    });
  }
  for (auto& thread : pool) thread.join();
  return wrong.load();
}

std::vector<double> joined(std::initializer_list<std::vector<double>> parts) {
  std::vector<double> all;
  for (const auto& p : parts) all.insert(all.end(), p.begin(), p.end());
  return all;
}

template <class T>
class ConcurrentCalls : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(ConcurrentCalls, Types);

TYPED_TEST(ConcurrentCalls, SinkhornForwardAndImplicitBackward) {
  using T = TypeParam;
  const int batch = 96, n = 16;
  const std::size_t size = std::size_t(batch) * n * n;
  const auto call = [&](int t) {
    const auto X = to_device<T***>(uniform(size, -2.0, 2.0, 10 + t), batch, n, n);
    const auto G = to_device<T***>(normal(size, 20 + t), batch, n, n);
    DeviceView<T***> R("R", batch, n, n), dX("dX", batch, n, n);
    kdnn::sinkhorn::forward(Space(), X, R, {30});
    kdnn::sinkhorn::backward(Space(), R, G, dX);
    Space().fence();
    return joined({to_host(R), to_host(dX)});
  };
  EXPECT_EQ(mismatches_under_threads(call), 0)
      << "of " << kThreads * kRepeats << " concurrent calls";
}

TYPED_TEST(ConcurrentCalls, FusedAttentionForwardAndBackward) {
  using T = TypeParam;
  namespace at = kdnn::attention;
  const int B = 1, H = 2, S = 96, D = 32;
  const std::size_t size = std::size_t(B) * H * S * D;
  const auto call = [&](int t) {
    const auto q = to_device<T****>(normal(size, 30 + t), B, H, S, D);
    const auto k = to_device<T****>(normal(size, 40 + t), B, H, S, D);
    const auto v = to_device<T****>(normal(size, 50 + t), B, H, S, D);
    const auto g = to_device<T****>(normal(size, 60 + t), B, H, S, D);
    DeviceView<T****> o("o", B, H, S, D), dq("dq", B, H, S, D), dk("dk", B, H, S, D),
        dv("dv", B, H, S, D);
    DeviceView<T***> lse("lse", B, H, S);
    at::FusedAttentionOptions opts;
    opts.scale = 0.2;
    at::fused_attention_forward(Space(), q, k, v, o, lse, opts);
    at::fused_attention_backward(Space(), q, k, v, o, lse, g, dq, dk, dv, opts);
    Space().fence();
    return joined({to_host(o), to_host(dq), to_host(dk), to_host(dv)});
  };
  EXPECT_EQ(mismatches_under_threads(call), 0)
      << "of " << kThreads * kRepeats << " concurrent calls";
}

TYPED_TEST(ConcurrentCalls, CausalConvForwardAndBackward) {
  using T = TypeParam;
  namespace ssm = kdnn::ssm;
  const int B = 2, L = 150, C = 24, K = 4;
  const std::size_t size = std::size_t(B) * L * C;
  const auto call = [&](int t) {
    const auto x = to_device<T***>(normal(size, 70 + t), B, L, C);
    const auto dy = to_device<T***>(normal(size, 80 + t), B, L, C);
    const auto w = to_device<T**>(normal(std::size_t(C) * K, 90 + t), C, K);
    DeviceView<T***> y("y", B, L, C), dx("dx", B, L, C);
    DeviceView<T**> dw("dw", C, K);
    ssm::ConvForward<T, Space> f;
    f.x = x;
    f.w = w;
    f.y = y;
    ssm::causal_conv1d_forward(Space(), f);
    ssm::ConvBackward<T, Space> b;
    b.x = x;
    b.w = w;
    b.dy = dy;
    b.dx = dx;
    b.dw = dw;
    ssm::causal_conv1d_backward(Space(), b);
    Space().fence();
    return joined({to_host(y), to_host(dx), to_host(dw)});
  };
  EXPECT_EQ(mismatches_under_threads(call), 0)
      << "of " << kThreads * kRepeats << " concurrent calls";
}

TYPED_TEST(ConcurrentCalls, SsdForwardAndBackward) {
  using T = TypeParam;
  namespace ssm = kdnn::ssm;
  const int B = 1, L = 100, H = 2, P = 8, G = 1, N = 8;
  const std::size_t xs = std::size_t(B) * L * H * P, bs = std::size_t(B) * L * G * N;
  const auto call = [&](int t) {
    const auto x = to_device<T****>(normal(xs, 100 + t), B, L, H, P);
    const auto dy = to_device<T****>(normal(xs, 110 + t), B, L, H, P);
    const auto dt = to_device<T***>(uniform(std::size_t(B) * L * H, 0.01, 0.2, 120 + t), B, L, H);
    const auto A = to_device<T*>(uniform(std::size_t(H), -2.0, -0.5, 130 + t), H);
    const auto Bm = to_device<T****>(normal(bs, 140 + t), B, L, G, N);
    const auto Cm = to_device<T****>(normal(bs, 150 + t), B, L, G, N);
    DeviceView<T****> y("y", B, L, H, P), dx("dx", B, L, H, P), dB("dB", B, L, G, N),
        dC("dC", B, L, G, N);
    DeviceView<T***> ddt("ddt", B, L, H);
    DeviceView<T*> dA("dA", H);
    ssm::SsdOptions opts;
    opts.chunk = 32;
    ssm::SsdForward<T, Space> f;
    f.x = x;
    f.dt = dt;
    f.A = A;
    f.B = Bm;
    f.C = Cm;
    f.y = y;
    ssm::ssd_forward(Space(), f, opts);
    ssm::SsdBackward<T, Space> b;
    b.x = x;
    b.dt = dt;
    b.A = A;
    b.B = Bm;
    b.C = Cm;
    b.dy = dy;
    b.dx = dx;
    b.ddt = ddt;
    b.dA = dA;
    b.dB = dB;
    b.dC = dC;
    ssm::ssd_backward(Space(), b, opts);
    Space().fence();
    return joined({to_host(y), to_host(dx), to_host(ddt), to_host(dA), to_host(dB), to_host(dC)});
  };
  EXPECT_EQ(mismatches_under_threads(call), 0)
      << "of " << kThreads * kRepeats << " concurrent calls";
}

TEST(ConcurrentCalls, FromAThreadThatNeverUsedKokkos) {
  // Inputs and outputs made here; the new thread only calls kdnn (on Kokkos
  // 3.4's OpenMP backend, such a thread has no thread pool until kdnn gives
  // it one).
  const int batch = 8, n = 12;
  const std::size_t size = std::size_t(batch) * n * n;
  const auto X = to_device<double***>(uniform(size, -2.0, 2.0, 7), batch, n, n);
  const auto G = to_device<double***>(normal(size, 8), batch, n, n);
  DeviceView<double***> R("R", batch, n, n), dX("dX", batch, n, n);
  DeviceView<double***> R_here("R_here", batch, n, n), dX_here("dX_here", batch, n, n);
  const auto call = [&](const DeviceView<double***>& r, const DeviceView<double***>& dx) {
    kdnn::sinkhorn::forward(Space(), X, r, {20});
    kdnn::sinkhorn::backward(Space(), r, G, dx);
    Space().fence();
  };
  std::string error;
  std::thread([&] {
    try {
      call(R, dX);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }).join();
  ASSERT_EQ(error, "");
  call(R_here, dX_here);
  EXPECT_EQ(to_host(R), to_host(R_here));
  EXPECT_EQ(to_host(dX), to_host(dX_here));
}

}  // namespace
