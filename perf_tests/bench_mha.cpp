// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Multi-head attention layer benchmarks (float32): forward, backward (data
// then weights) and the whole training step, at --kdnn_sizes=BxHxSxSkxD,...
// (default 8x4x128x128x64,2x4x1024x1024x64: eigenMHA's size and S = Sk =
// 1024). Every feature size is H·D (E_q = E_k = E_v = E_o = H·D, Dv = D),
// biases on, no mask, no dropout. GFLOP/s counts the GEMMs' multiply-adds
// twice: forward
//   2·B·(S + 2·Sk)·E·H·D + 2·B·S·H·D·E        (projections)
//   + 4·B·H·S·Sk·D                            (Q·Kᵀ and P·V)
// and the backward twice that (each product has two gradients).
// perf_tests/compare_mha.py runs this and the PyTorch formulation
// (mha_torch.py) in one go and prints the ratios.
#include <benchmark/benchmark.h>

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "bench_main.hpp"
#include "kdnn/attention/mha.hpp"

namespace {

namespace at = kdnn::attention;
using Space = Kokkos::DefaultExecutionSpace;
using T = float;

enum class Phase { forward, backward, step };

template <class View, class... Extents>
View random_view(const std::string& name, unsigned seed, double scale, Extents... extents) {
  View v(name, std::size_t(extents)...);
  auto h = Kokkos::create_mirror_view(v);
  std::mt19937 gen(seed);
  std::normal_distribution<double> normal(0.0, scale);
  for (std::size_t k = 0; k < h.size(); ++k) h.data()[k] = T(normal(gen));
  Kokkos::deep_copy(v, h);
  return v;
}

double forward_flops(double B, double H, double S, double Sk, double D) {
  const double E = H * D;
  return 2 * B * (S + 2 * Sk) * E * H * D + 2 * B * S * H * D * E + 4 * B * H * S * Sk * D;
}

void run(benchmark::State& state, Phase phase) {
  const std::size_t B = state.range(0), H = state.range(1), S = state.range(2), Sk = state.range(3),
                    D = state.range(4), E = H * D;
  using M = at::Matrix<T, Space>;
  using V = at::Vector<T, Space>;
  using X = at::Tensor3<T, Space>;
  const double w_scale = 1 / std::sqrt(double(E));
  at::MhaParams<T, Space> w{
      random_view<M>("w_q", 1, w_scale, H * D, E), random_view<M>("w_k", 2, w_scale, H * D, E),
      random_view<M>("w_v", 3, w_scale, H * D, E), random_view<M>("w_o", 4, w_scale, E, H * D),
      random_view<V>("b_q", 5, 1, H * D),          random_view<V>("b_k", 6, 1, H * D),
      random_view<V>("b_v", 7, 1, H * D),          random_view<V>("b_o", 8, 1, E)};
  at::MhaParams<T, Space> dw{M("dw_q", H * D, E), M("dw_k", H * D, E), M("dw_v", H * D, E),
                             M("dw_o", E, H * D), V("db_q", H * D),    V("db_k", H * D),
                             V("db_v", H * D),    V("db_o", E)};
  const X q = random_view<X>("q", 9, 1, B, S, E), k = random_view<X>("k", 10, 1, B, Sk, E),
          v = random_view<X>("v", 11, 1, B, Sk, E), dout = random_view<X>("dout", 12, 1, B, S, E);
  const X out("out", B, S, E), dq("dq", B, S, E), dk("dk", B, Sk, E), dv("dv", B, Sk, E);
  const auto sizes = at::mha_buffer_sizes({B, S, Sk, E, E, E, H, D, D, E});
  const V reserve("reserve", sizes.reserve), workspace("workspace", sizes.workspace);
  at::MhaOptions opts;
  opts.heads = int(H);
  const at::AttentionMask<Space> mask{};
  const X none;
  Space space;
  const auto forward = [&] {
    at::mha_forward(space, opts, mask, w, q, k, v, none, out, reserve, workspace);
  };
  const auto backward = [&] {
    at::mha_backward_data(space, opts, mask, w, dout, dq, dk, dv, none, reserve, workspace);
    at::mha_backward_weights(space, opts, w, q, k, v, dw, at::WgradMode::set, reserve);
  };
  forward();
  backward();
  space.fence();
  for (auto _ : state) {
    if (phase != Phase::backward) forward();
    if (phase != Phase::forward) backward();
    space.fence();
  }
  const double flops = forward_flops(B, H, S, Sk, D) * (phase == Phase::forward    ? 1
                                                        : phase == Phase::backward ? 2
                                                                                   : 3);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

int main(int argc, char** argv) {
  return kdnn_bench::main(
      argc, argv, "8x4x128x128x64,2x4x1024x1024x64", 5, "BxHxSxSkxD", [](const auto& sizes) {
        const std::pair<const char*, Phase> phases[] = {
            {"forward", Phase::forward}, {"backward", Phase::backward}, {"step", Phase::step}};
        for (const auto& size : sizes) {
          for (const auto& [name, phase] : phases) {
            benchmark::RegisterBenchmark((std::string("mha_f32/") + name).c_str(), run, phase)
                ->Args(size)
                ->Unit(benchmark::kMillisecond)
                ->UseRealTime();
          }
        }
      });
}
