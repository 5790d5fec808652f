// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Mamba-2's causal depthwise conv1d + SiLU (kdnn::ssm::causal_conv1d_*),
// channel-last x [B, L, C] and w [C, K], at --kdnn_sizes=BxLxCxK,...
// (default 8x4096x1024x4,2x16384x2048x4). Three benchmarks per size:
//   forward:  y = SiLU(conv(x, w) + bias), no initial or final state
//   backward: dx, dw, dbias from x, w, bias and dy (SiLU recomputed)
//   copy:     Kokkos::deep_copy of a View of B·L·C floats into another, the
//             copy bandwidth of this machine in this run, for reference
// and, on a GPU, forward_tiled and backward_tiled: the same with
// launch.form = host, the tiled kernels (team scratch) instead of the
// register windows, so that one run compares both forms. Each but copy also
// runs as NAME_packed: the same steps as packed sequences (seq_idx) of
// lengths drawn from [64, 4096] (packed_lengths.hpp); the target is within
// 1.2x the time of the unpacked row.
// Every benchmark runs with float32 activations (ssm_conv_f32/...) and with
// bfloat16 ones (ssm_conv_bf16/...: 16-bit storage, float32 weights and
// compute), whose target is 1.5x float32's throughput (half the bytes).
// Each reports `bytes`, the bytes it must move at least once, and GB/s
// (bytes / time, 1e9 bytes), with s the activations' size (4 or 2):
//   forward:  read x, write y            2·B·L·C·s + C·K·4 (w)
//   backward: read x and dy, write dx    3·B·L·C·s + C·K·4 (w)
//   copy:     read src, write dst        2·B·L·C·s
// (bias, dw and dbias, C·(K+1)·4 bytes more, are left out.) The space is
// fenced at the end of every timed iteration. compare_ssm_conv.py runs this
// and PyTorch's formulation at the same sizes and prints the ratios.
#include <benchmark/benchmark.h>

#include <Kokkos_Core.hpp>
#include <Kokkos_Random.hpp>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "bench_main.hpp"
#include "kdnn/ssm/causal_conv1d.hpp"
#include "packed_lengths.hpp"

namespace {

namespace ssm = kdnn::ssm;
using Space = Kokkos::DefaultExecutionSpace;

enum class Op { forward, backward, copy, forward_tiled, backward_tiled };

/// Uniform in [-1, 1), filled on the device (rounded to the View's type).
template <class View>
View random_view(const View& v, unsigned seed) {
  using T = typename View::non_const_value_type;
  Kokkos::View<float*, Space> values("values", v.size());
  Kokkos::Random_XorShift64_Pool<Space> pool(seed);
  Kokkos::fill_random(values, pool, -1.0f, 1.0f);
  T* out = v.data();
  Kokkos::parallel_for(
      "random_view", Kokkos::RangePolicy<Space>(0, v.size()),
      KOKKOS_LAMBDA(std::size_t i) { out[i] = kdnn::from_compute<T>(values(i)); });
  return v;
}

template <class T>
void run(benchmark::State& state, Op op, bool packed) {
  using Param = kdnn::compute_t<T>;
  const std::size_t B = state.range(0), L = state.range(1), C = state.range(2), K = state.range(3);
  const double n = double(B) * L * C;
  double bytes = 0;
  Space space;
  if (op == Op::copy) {
    const kdnn::Tensor3<T, Space> src = random_view(kdnn::Tensor3<T, Space>("src", B, L, C), 1);
    kdnn::Tensor3<T, Space> dst("dst", B, L, C);
    Kokkos::deep_copy(space, dst, src);  // warm-up (first touch)
    space.fence();
    for (auto _ : state) {
      Kokkos::deep_copy(space, dst, src);
      space.fence();
    }
    bytes = 2 * n * sizeof(T);
  } else {
    const kdnn::Tensor3<T, Space> x = random_view(kdnn::Tensor3<T, Space>("x", B, L, C), 1);
    const kdnn::Matrix<Param, Space> w = random_view(kdnn::Matrix<Param, Space>("w", C, K), 2);
    const kdnn::Vector<Param, Space> bias = random_view(kdnn::Vector<Param, Space>("bias", C), 3);
    kdnn::Matrix<const int, Space> seq_idx;
    if (packed) {
      seq_idx = kdnn_bench::packed_ids<Space>(B, kdnn_bench::packed_lengths(int(L), 64, 4096));
    }
    ssm::CausalConv1dOptions opts;
    opts.silu = true;
    if (op == Op::forward_tiled || op == Op::backward_tiled) {
      opts.launch.form = kdnn::KernelForm::host;
      op = op == Op::forward_tiled ? Op::forward : Op::backward;
    }
    if (op == Op::forward) {
      ssm::ConvForward<T, Space> args;
      args.x = x;
      args.w = w;
      args.bias = bias;
      args.seq_idx = seq_idx;
      args.y = kdnn::Tensor3<T, Space>("y", B, L, C);
      ssm::causal_conv1d_forward(space, args, opts);  // warm-up
      space.fence();
      for (auto _ : state) {
        ssm::causal_conv1d_forward(space, args, opts);
        space.fence();
      }
      bytes = 2 * n * sizeof(T);
    } else {
      ssm::ConvBackward<T, Space> args;
      args.x = x;
      args.w = w;
      args.bias = bias;
      args.seq_idx = seq_idx;
      args.dy = random_view(kdnn::Tensor3<T, Space>("dy", B, L, C), 4);
      args.dx = kdnn::Tensor3<T, Space>("dx", B, L, C);
      args.dw = kdnn::Matrix<Param, Space>("dw", C, K);
      args.dbias = kdnn::Vector<Param, Space>("dbias", C);
      ssm::causal_conv1d_backward(space, args, opts);  // warm-up
      space.fence();
      for (auto _ : state) {
        ssm::causal_conv1d_backward(space, args, opts);
        space.fence();
      }
      bytes = 3 * n * sizeof(T);
    }
    bytes += double(C) * K * sizeof(Param);  // w
  }
  state.counters["bytes"] = bytes;
  state.counters["GB/s"] =
      benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

int main(int argc, char** argv) {
  return kdnn_bench::main(
      argc, argv, "8x4096x1024x4,2x16384x2048x4", 4, "BxLxCxK", [](const auto& sizes) {
        std::vector<std::pair<const char*, Op>> ops = {
            {"forward", Op::forward}, {"backward", Op::backward}, {"copy", Op::copy}};
        if (!Kokkos::SpaceAccessibility<Kokkos::HostSpace, Space::memory_space>::accessible) {
          ops.insert(ops.end(), {{"forward_tiled", Op::forward_tiled},
                                 {"backward_tiled", Op::backward_tiled}});
        }
        const std::pair<const char*, void (*)(benchmark::State&, Op, bool)> types[] = {
            {"f32", run<float>}, {"bf16", run<kdnn::bfloat16>}, {"f16", run<kdnn::float16>}};
        for (const auto& size : sizes) {
          for (const auto& op : ops) {
            for (const auto& [type, runner] : types) {
              for (const bool packed : {false, true}) {
                if (packed && op.second == Op::copy) continue;
                const std::string name =
                    std::string("ssm_conv_") + type + "/" + op.first + (packed ? "_packed" : "");
                benchmark::RegisterBenchmark(name.c_str(), runner, op.second, packed)
                    ->Args(size)
                    ->Unit(benchmark::kMillisecond)
                    ->UseRealTime();
              }
            }
          }
        }
      });
}
