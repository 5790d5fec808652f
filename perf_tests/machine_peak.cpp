// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The machine's ceilings that kdnn's CPU benchmarks are measured against:
// the fused multiply-add peak of float and double (independent FMA chains
// on the widest host vectors, 64 bytes with AVX-512, else the library's
// width, core/impl/host_simd.hpp; enough chains to cover the FMA units'
// latency) and the copy bandwidth (STREAM's copy:
// bytes read plus bytes written per second, over arrays far larger than
// the caches), each on 1 … --threads threads (one std::thread each, the
// best of five runs). Prints one JSON object:
//   {"threads": [1, 2], "float32_gflops": [...], "float64_gflops": [...],
//    "copy_gbs": [...]}
// The perf_tests/compare_*.py scripts read it (machine_peak.py) to report
// each figure as a fraction of the ceiling.
//
//   build/serial/perf_tests/kdnn_machine_peak [--threads N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kdnn/core/impl/host_simd.hpp"

namespace {

using Clock = std::chrono::steady_clock;

/// Seconds of the slowest of `threads` threads running f(thread), best of 5.
template <class F>
double best_time(int threads, const F& f) {
  double best = 1e30;
  for (int run = 0; run < 5; ++run) {
    std::vector<std::thread> pool;
    const auto start = Clock::now();
    for (int t = 0; t < threads; ++t) pool.emplace_back([&f, t] { f(t); });
    for (auto& th : pool) th.join();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return best;
}

#if KDNN_IMPL_HOST_SIMD
constexpr int kChains = 12;  ///< independent accumulators: ≥ latency × FMA units
#if defined(__AVX512F__)
constexpr int kBytes = 64;
#else
constexpr int kBytes = kdnn::impl::kHostGemmVectorBytes;
#endif
constexpr long kSteps = 20000000;

/// FLOP/s of kChains FMA chains on vectors of the library's width.
template <class T>
double fma_gflops(int threads) {
  using Vec = typename kdnn::impl::HostVector<T, kBytes>::type;
  constexpr int lanes = kBytes / int(sizeof(T));
  std::vector<T> sink(std::size_t(threads), T(0));
  const double seconds = best_time(threads, [&](int t) {
    Vec acc[kChains], x = Vec{} + T(0.999999), y = Vec{} + T(1e-7);
    for (int c = 0; c < kChains; ++c) acc[c] = Vec{} + T(c);
    for (long i = 0; i < kSteps; ++i) {
      for (int c = 0; c < kChains; ++c) acc[c] = acc[c] * x + y;
      asm volatile("" : "+v"(x));  // x is not a constant: no folding
    }
    T sum = 0;
    for (int c = 0; c < kChains; ++c) sum += acc[c][0];
    sink[std::size_t(t)] = sum;
  });
  return 2.0 * lanes * kChains * double(kSteps) * threads / seconds / 1e9;
}
#else
template <class T>
double fma_gflops(int) {
  return 0;  // no host vectors: not measured
}
#endif

/// Bytes read + written per second by memcpy over 256 MiB in all.
double copy_gbs(int threads) {
  const std::size_t bytes = std::size_t(256) << 20, part = bytes / std::size_t(threads);
  std::vector<char> from(bytes, 1), to(bytes, 0);
  const double seconds = best_time(threads, [&](int t) {
    std::memcpy(to.data() + part * std::size_t(t), from.data() + part * std::size_t(t), part);
  });
  return 2.0 * double(part) * threads / seconds / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  int most = int(std::thread::hardware_concurrency());
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--threads" && i + 1 < argc) {
      most = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--threads N]\n", argv[0]);
      return 2;
    }
  }
  if (most < 1) most = 1;
  std::string threads, f32, f64, copy;
  for (int n = 1; n <= most; ++n) {
    const char* sep = n > 1 ? ", " : "";
    char cell[64];
    threads += sep + std::to_string(n);
    std::snprintf(cell, sizeof cell, "%s%.1f", sep, fma_gflops<float>(n));
    f32 += cell;
    std::snprintf(cell, sizeof cell, "%s%.1f", sep, fma_gflops<double>(n));
    f64 += cell;
    std::snprintf(cell, sizeof cell, "%s%.1f", sep, copy_gbs(n));
    copy += cell;
  }
  std::printf(
      "{\"threads\": [%s], \"float32_gflops\": [%s], \"float64_gflops\": [%s], "
      "\"copy_gbs\": [%s]}\n",
      threads.c_str(), f32.c_str(), f64.c_str(), copy.c_str());
  return 0;
}
