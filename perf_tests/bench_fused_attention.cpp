// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Scaled-dot-product attention on per-head tensors, fused (flash-style, O(S)
// memory; `fused` takes the backend's form, `fusedhost` pins the host form,
// so that one run on a GPU times both) vs unfused (scores, masked softmax and
// P·V materialised), float32 (and the fused GPU/host form in float64, as
// sdpa_f64/...), forward and backward, at --kdnn_sizes=BxHxSxSkxD,... (default
// 8x4x128x128x64,1x8x2048x2048x64), no mask, no dropout. GFLOP/s counts
// 4·B·H·S·Sk·D for the forward and 2.5 times that for the backward (the
// FlashAttention convention). peak_MiB is the most memory Kokkos held while
// the phase ran: inputs, outputs, what the forward keeps for the backward
// and the phase's own allocations (Kokkos' tools callbacks count every
// allocation of every memory space; a backend's reused scratch pool is
// counted when it grows).
#include <benchmark/benchmark.h>

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "bench_main.hpp"
#include "kdnn/attention/batched_gemm.hpp"
#include "kdnn/attention/fused_attention.hpp"

namespace {

namespace at = kdnn::attention;
using Space = Kokkos::DefaultExecutionSpace;
template <class T>
using Tensor4 = at::Tensor4<T, Space>;

/// Bytes Kokkos holds now and their peak since the last reset.
struct Memory {
  static inline std::int64_t current = 0, peak = 0;
  static void allocate(Kokkos::Profiling::SpaceHandle, const char*, const void*, std::uint64_t n) {
    current += std::int64_t(n);
    if (current > peak) peak = current;
  }
  static void deallocate(Kokkos::Profiling::SpaceHandle, const char*, const void*,
                         std::uint64_t n) {
    current -= std::int64_t(n);
  }
};

enum class Path { fused, fused_host, unfused };
enum class Phase { forward, backward };

template <class T>
Tensor4<T> random_view(const std::string& name, unsigned seed, std::size_t B, std::size_t H,
                       std::size_t rows, std::size_t cols) {
  Tensor4<T> v(name, B, H, rows, cols);
  auto h = Kokkos::create_mirror_view(v);
  std::mt19937 gen(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (std::size_t k = 0; k < h.size(); ++k) h.data()[k] = T(normal(gen));
  Kokkos::deep_copy(v, h);
  return v;
}

template <class T>
void run(benchmark::State& state, Path path, Phase phase) {
  const std::size_t B = state.range(0), H = state.range(1), S = state.range(2), Sk = state.range(3),
                    D = state.range(4);
  using View4 = Tensor4<T>;
  const View4 q = random_view<T>("q", 1, B, H, S, D), k = random_view<T>("k", 2, B, H, Sk, D),
              v = random_view<T>("v", 3, B, H, Sk, D), g = random_view<T>("dout", 4, B, H, S, D);
  View4 o("o", B, H, S, D), dq("dq", B, H, S, D), dk("dk", B, H, Sk, D), dv("dv", B, H, Sk, D);
  at::Tensor3<T, Space> lse("lse", B, H, S);
  at::FusedAttentionOptions opts;
  opts.scale = 1 / std::sqrt(double(D));
  if (path == Path::fused_host) opts.launch.form = kdnn::KernelForm::host;
  const at::SoftmaxOptions softmax{at::SoftmaxMode::accurate, opts.scale};
  View4 scores, P, dP;
  if (path == Path::unfused) {
    scores = View4("scores", B, H, S, Sk), P = View4("P", B, H, S, Sk);
    if (phase == Phase::backward) dP = View4("dP", B, H, S, Sk);
  }
  const auto none = at::Op::none, tr = at::Op::transpose;
  Space space;
  const auto forward = [&] {
    if (path != Path::unfused) {
      at::fused_attention_forward(space, q, k, v, o, lse, opts);
    } else {
      at::batched_gemm(space, none, tr, none, T(1), q, k, T(0), scores);
      at::softmax_forward(space, scores, P, softmax);
      at::batched_gemm(space, none, none, none, T(1), P, v, T(0), o);
    }
  };
  const auto backward = [&] {
    if (path != Path::unfused) {
      at::fused_attention_backward(space, q, k, v, o, lse, g, dq, dk, dv, opts);
    } else {
      at::batched_gemm(space, tr, none, none, T(1), P, g, T(0), dv);
      at::batched_gemm(space, none, tr, none, T(1), g, v, T(0), dP);
      at::softmax_backward(space, P, dP, scores, softmax);  // dS into scores
      at::batched_gemm(space, none, none, none, T(1), scores, k, T(0), dq);
      at::batched_gemm(space, tr, none, none, T(1), scores, q, T(0), dk);
    }
  };
  forward();
  space.fence();
  Memory::peak = Memory::current;
  for (auto _ : state) {
    if (phase == Phase::forward) {
      forward();
    } else {
      backward();
    }
    space.fence();
  }
  const double flops = 4.0 * B * H * S * Sk * D * (phase == Phase::forward ? 1 : 2.5);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["peak_MiB"] = double(Memory::peak) / (1 << 20);
}

}  // namespace

int main(int argc, char** argv) {
  return kdnn_bench::main(
      argc, argv, "8x4x128x128x64,1x8x2048x2048x64", 5, "BxHxSxSkxD", [](const auto& sizes) {
        Kokkos::Tools::Experimental::set_allocate_data_callback(&Memory::allocate);
        Kokkos::Tools::Experimental::set_deallocate_data_callback(&Memory::deallocate);
        const std::pair<const char*, Path> paths[] = {
            {"fused", Path::fused}, {"fusedhost", Path::fused_host}, {"unfused", Path::unfused}};
        const std::pair<const char*, Phase> phases[] = {{"forward", Phase::forward},
                                                        {"backward", Phase::backward}};
        for (const auto& size : sizes) {
          for (const auto& path : paths) {
            for (const auto& phase : phases) {
              const std::string name = std::string("sdpa_f32/") + path.first + "_" + phase.first;
              benchmark::RegisterBenchmark(name.c_str(), run<float>, path.second, phase.second)
                  ->Args(size)
                  ->Unit(benchmark::kMillisecond)
                  ->UseRealTime();
              if (path.second != Path::fused) continue;
              const std::string name64 = std::string("sdpa_f64/") + path.first + "_" + phase.first;
              benchmark::RegisterBenchmark(name64.c_str(), run<double>, path.second, phase.second)
                  ->Args(size)
                  ->Unit(benchmark::kMillisecond)
                  ->UseRealTime();
            }
          }
        }
      });
}
