// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Fused attention over packed variable-length sequences against one
// sequence of the longest length, both causal, in the same process: the
// packing's lengths are drawn uniformly from [MIN, MAX] (seed 7) until they
// total T tokens (the last one cut to fit). GFLOP/s counts only the pairs
// the causal mask leaves (L·(L + 1)/2 per sequence of L tokens; 4·D flops
// each forward, 2.5 times that backward), so the two rows compare directly:
// the target is packed ≥ 0.8× one sequence.
//   kdnn_perf_fused_attention_varlen --kdnn_sizes=TxHxDxMINxMAX
#include <benchmark/benchmark.h>

#include <Kokkos_Core.hpp>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "bench_main.hpp"
#include "kdnn/attention/fused_attention.hpp"
#include "kdnn/attention/fused_attention_varlen.hpp"
#include "packed_lengths.hpp"

namespace {

namespace at = kdnn::attention;
using Space = Kokkos::DefaultExecutionSpace;

enum class Phase { forward, backward };

template <class View, class... Extents>
View random_view(const std::string& name, unsigned seed, Extents... extents) {
  View v(name, std::size_t(extents)...);
  auto h = Kokkos::create_mirror_view(v);
  std::mt19937 gen(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (std::size_t k = 0; k < h.size(); ++k) h.data()[k] = float(normal(gen));
  Kokkos::deep_copy(v, h);
  return v;
}

/// The causal pairs of the lengths, times the flops per pair.
double causal_flops(const std::vector<int>& lengths, int H, int D, Phase phase) {
  double pairs = 0;
  for (const int L : lengths) pairs += 0.5 * double(L) * double(L + 1);
  return 4.0 * H * D * pairs * (phase == Phase::forward ? 1 : 2.5);
}

void packed(benchmark::State& state, Phase phase) {
  const int T = int(state.range(0)), H = int(state.range(1)), D = int(state.range(2));
  const std::vector<int> lengths =
      kdnn_bench::packed_lengths(T, int(state.range(3)), int(state.range(4)));
  using View3 = kdnn::Tensor3<float, Space>;
  const auto q = random_view<View3>("q", 1, T, H, D), k = random_view<View3>("k", 2, T, H, D),
             v = random_view<View3>("v", 3, T, H, D), g = random_view<View3>("dout", 4, T, H, D);
  View3 o("o", T, H, D), dq("dq", T, H, D), dk("dk", T, H, D), dv("dv", T, H, D);
  kdnn::Matrix<float, Space> lse("lse", H, T);
  const auto cu = kdnn_bench::packed_offsets<Space>(lengths);
  const at::PackedSequences<Space> seqs{cu, cu};
  at::FusedAttentionOptions opts;
  opts.scale = 1 / std::sqrt(double(D));
  at::AttentionMask<Space> mask;
  mask.causal = true;
  Space space;
  at::fused_attention_varlen_forward(space, q, k, v, o, lse, seqs, opts, mask);
  space.fence();
  for (auto _ : state) {
    if (phase == Phase::forward) {
      at::fused_attention_varlen_forward(space, q, k, v, o, lse, seqs, opts, mask);
    } else {
      at::fused_attention_varlen_backward(space, q, k, v, o, lse, g, dq, dk, dv, seqs, opts, mask);
    }
    space.fence();
  }
  state.counters["GFLOP/s"] = benchmark::Counter(causal_flops(lengths, H, D, phase) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
  state.counters["sequences"] = double(lengths.size());
}

void one_sequence(benchmark::State& state, Phase phase) {
  const int H = int(state.range(1)), D = int(state.range(2)), L = int(state.range(4));
  using View4 = kdnn::Tensor4<float, Space>;
  const auto q = random_view<View4>("q", 1, 1, H, L, D), k = random_view<View4>("k", 2, 1, H, L, D),
             v = random_view<View4>("v", 3, 1, H, L, D),
             g = random_view<View4>("dout", 4, 1, H, L, D);
  View4 o("o", 1, H, L, D), dq("dq", 1, H, L, D), dk("dk", 1, H, L, D), dv("dv", 1, H, L, D);
  kdnn::Tensor3<float, Space> lse("lse", 1, H, L);
  at::FusedAttentionOptions opts;
  opts.scale = 1 / std::sqrt(double(D));
  at::AttentionMask<Space> mask;
  mask.causal = true;
  Space space;
  at::fused_attention_forward(space, q, k, v, o, lse, opts, mask);
  space.fence();
  for (auto _ : state) {
    if (phase == Phase::forward) {
      at::fused_attention_forward(space, q, k, v, o, lse, opts, mask);
    } else {
      at::fused_attention_backward(space, q, k, v, o, lse, g, dq, dk, dv, opts, mask);
    }
    space.fence();
  }
  state.counters["GFLOP/s"] = benchmark::Counter(causal_flops({L}, H, D, phase) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

int main(int argc, char** argv) {
  return kdnn_bench::main(
      argc, argv, "32768x8x64x64x4096", 5, "TxHxDxMINxMAX", [](const auto& sizes) {
        const std::pair<const char*, Phase> phases[] = {{"forward", Phase::forward},
                                                        {"backward", Phase::backward}};
        using Run = void (*)(benchmark::State&, Phase);
        const std::pair<const char*, Run> runs[] = {{"packed", &packed},
                                                    {"one_sequence", &one_sequence}};
        for (const auto& size : sizes) {
          for (const auto& phase : phases) {
            for (const auto& run : runs) {
              const std::string label = std::string("varlen_f32/") + run.first + "_" + phase.first;
              benchmark::RegisterBenchmark(label.c_str(), run.second, phase.second)
                  ->Args(size)
                  ->Unit(benchmark::kMillisecond)
                  ->UseRealTime();
            }
          }
        }
      });
}
