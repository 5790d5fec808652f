// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Sinkhorn benchmarks: forward and the three backwards at the reference sizes.
// Each reports time and effective bandwidth against the bytes the operation
// must move at least once:
//   forward:            read X, write R         2 B n² sizeof(T)
//   implicit / block:   read R and G, write dX  3 B n² sizeof(T)
//   unrolled:           read X and G, write dX  3 B n² sizeof(T)
// The PyTorch formulation is timed by sinkhorn_torch.py; compare_sinkhorn.py
// runs both and prints the ratios. forward_host and forward_gpu,
// implicit_host, block_host and unrolled_host pin the kernel form
// (kdnn::KernelForm; forward, implicit, block and unrolled are the
// automatic one: on a GPU, the thread form for n <= 4 and the lane form for
// n in {8, 16, 32}), so one
// run times both forms.
// Sizes: --kdnn_sizes=BxNxITERS,... (default
// 4096x16x100,10001x4x48).
#include <cstdio>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <benchmark/benchmark.h>
#include <Kokkos_Core.hpp>

#include "bench_main.hpp"
#include "kdnn/sinkhorn/sinkhorn.hpp"

namespace {

namespace sk = kdnn::sinkhorn;
using Space = Kokkos::DefaultExecutionSpace;
template <class T>
using Batch = sk::Batch<T, Space>;

enum class Op {
  forward,
  forward_host,
  forward_gpu,
  implicit,
  implicit_host,
  block,
  block_host,
  unrolled,
  unrolled_host
};

template <class T>
void fill(const Batch<T>& v, unsigned seed, bool logits) {
  auto h = Kokkos::create_mirror_view(v);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(0.0, 4.0);
  std::normal_distribution<double> g(0.0, 1.0);
  for (std::size_t k = 0; k < h.size(); ++k) h.data()[k] = T(logits ? u(gen) : g(gen));
  Kokkos::deep_copy(v, h);
}

template <class T>
void run(benchmark::State& state, Op op) {
  const int batch = int(state.range(0)), n = int(state.range(1)), iters = int(state.range(2));
  Batch<T> X("X", batch, n, n), G("G", batch, n, n), R("R", batch, n, n), dX("dX", batch, n, n);
  fill(X, 1, true);
  fill(G, 2, false);
  Space space;
  sk::forward(space, X, R, {iters});
  sk::BackwardOptions opts;
  opts.method = op == Op::block || op == Op::block_host ? sk::Method::block : sk::Method::implicit;
  if (op == Op::implicit_host || op == Op::block_host) opts.launch.form = kdnn::KernelForm::host;
  sk::ForwardOptions fwd{iters};
  if (op == Op::forward_host || op == Op::unrolled_host) {
    fwd.launch.form = kdnn::KernelForm::host;
  }
  if (op == Op::forward_gpu) fwd.launch.form = kdnn::KernelForm::gpu;
  sk::Report<Space> report;
  report.iterations = Kokkos::View<int*, Space::memory_space>("cg", batch);
  space.fence();
  for (auto _ : state) {
    switch (op) {
      case Op::forward:
      case Op::forward_host:
      case Op::forward_gpu:
        sk::forward(space, X, R, fwd);
        break;
      case Op::implicit:
      case Op::implicit_host:
      case Op::block:
      case Op::block_host:
        sk::backward(space, R, G, dX, opts, report);
        break;
      case Op::unrolled:
      case Op::unrolled_host:
        sk::backward_unrolled(space, X, G, dX, fwd);
        break;
    }
    space.fence();
  }
  const double elems = double(batch) * n * n;
  const bool forward = op == Op::forward || op == Op::forward_host || op == Op::forward_gpu;
  const double bytes = (forward ? 2 : 3) * elems * sizeof(T);
  state.SetBytesProcessed(int64_t(bytes * double(state.iterations())));
  if (op != Op::unrolled && op != Op::unrolled_host && !forward) {
    auto it = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), report.iterations);
    double sum = 0;
    for (int b = 0; b < batch; ++b) sum += it(b);
    state.counters["cg_iters"] = batch > 0 ? sum / batch : 0;
  }
}

}  // namespace

int main(int argc, char** argv) {
  // The reference sizes; GPUs want larger batches, e.g. 65536x16x100.
  return kdnn_bench::main(
      argc, argv, "4096x16x100,10001x4x48", 3, "BxNxITERS", [](const auto& sizes) {
        const std::pair<const char*, Op> ops[] = {{"forward", Op::forward},
                                                  {"forward_host", Op::forward_host},
                                                  {"forward_gpu", Op::forward_gpu},
                                                  {"implicit", Op::implicit},
                                                  {"implicit_host", Op::implicit_host},
                                                  {"block", Op::block},
                                                  {"block_host", Op::block_host},
                                                  {"unrolled", Op::unrolled},
                                                  {"unrolled_host", Op::unrolled_host}};
        for (const auto& s : sizes) {
          if (s[0] < 0 || s[1] < 1 || s[2] < 1) {
            throw std::invalid_argument("--kdnn_sizes: expected B >= 0, N >= 1, ITERS >= 1, got " +
                                        std::to_string(s[0]) + "x" + std::to_string(s[1]) + "x" +
                                        std::to_string(s[2]));
          }
        }
        for (const auto& [name, op] : ops) {
          for (const auto& s : sizes) {
            benchmark::RegisterBenchmark((std::string("sinkhorn_f32/") + name).c_str(),
                                         [op = op](benchmark::State& st) { run<float>(st, op); })
                ->Args(s)
                ->Unit(benchmark::kMillisecond)
                ->UseRealTime();
          }
        }
      });
}
