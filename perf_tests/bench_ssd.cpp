// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Mamba-2's SSD chunked scan (kdnn::ssm::ssd_forward / ssd_backward), float32,
// one group (G = 1, Mamba-2's default), at --kdnn_sizes=BxLxHxPxNxQ,...
// (default 2x4096x8x64x64x64,2x16384x8x64x64x64). Two benchmarks per size:
//   forward:  y and the final state from x, dt, A, B, C, D
//   backward: dx, ddt, dA, dB, dC, dD from the same and dy (the chunk
//             states are recomputed)
// Counters:
//   GFLOP/s          the chunked algorithm's matrix products, per
//                    (batch entry, head, chunk of Q): forward
//                    2Q·(2PN + Q(N + P)) (C·Bᵀ, Y_diag, the chunk state,
//                    Y_off), backward 2Q·(5PN + Q(3N + 2P)); / time
//   state_bytes_r4   bytes each rank sends in cp::ssd_forward with the
//                    sequence split over 4 ranks: its summary, B·H·(1 + P·N)
//                    values, to 3 ranks (backward: B·H·(1 + 2·P·N));
//                    independent of L
//   a2a_bytes_r4     what re-sharding by heads with all-to-alls would send
//                    per rank instead, ≈ (R−1)/R²·B·L·(3HP + 2GN + H) values
//                    at R = 4
// On a GPU backend each benchmark runs once per form, named by a suffix:
// /automatic, /gpu (FMAs), /tensor_cores (3×TF32) and /tf32 (tensor cores,
// one TF32 pass: Launch::allow_tf32); on a host only /automatic.
// The space is fenced at the end of every timed iteration. compare_ssd.py
// runs this and PyTorch's chunked formulation at the same sizes.
// forward_packed and backward_packed run the same L steps as packed
// sequences (seq_idx) of lengths drawn from [64, 4096] (packed_lengths.hpp):
// the target is within 1.2x the time of the unpacked rows.
#include <benchmark/benchmark.h>

#include <Kokkos_Core.hpp>
#include <Kokkos_Random.hpp>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "bench_main.hpp"
#include "kdnn/core/impl/backend_traits.hpp"
#include "kdnn/ssm/ssd.hpp"
#include "packed_lengths.hpp"

namespace {

namespace ssm = kdnn::ssm;
using Space = Kokkos::DefaultExecutionSpace;
using T = float;

/// Uniform in [lo, hi), filled on the device.
template <class View>
View random_view(const View& v, unsigned seed, T lo = -1, T hi = 1) {
  Kokkos::Random_XorShift64_Pool<Space> pool(seed);
  Kokkos::fill_random(v, pool, lo, hi);
  return v;
}

/// A form the benchmarks run in (see above).
struct Form {
  const char* name;
  kdnn::KernelForm form;
  bool allow_tf32;
};

void run(benchmark::State& state, bool backward, Form form, bool packed) {
  const std::int64_t B = state.range(0), L = state.range(1), H = state.range(2);
  const std::int64_t P = state.range(3), N = state.range(4), Q = state.range(5), G = 1;
  Space space;
  const kdnn::Tensor4<T, Space> x = random_view(kdnn::Tensor4<T, Space>("x", B, L, H, P), 1);
  const kdnn::Tensor3<T, Space> dt =
      random_view(kdnn::Tensor3<T, Space>("dt", B, L, H), 2, T(0.001), T(0.1));
  const kdnn::Vector<T, Space> A = random_view(kdnn::Vector<T, Space>("A", H), 3, T(-8), T(-1));
  const kdnn::Tensor4<T, Space> Bm = random_view(kdnn::Tensor4<T, Space>("B", B, L, G, N), 4);
  const kdnn::Tensor4<T, Space> Cm = random_view(kdnn::Tensor4<T, Space>("C", B, L, G, N), 5);
  const kdnn::Vector<T, Space> D = random_view(kdnn::Vector<T, Space>("D", H), 6);
  ssm::SsdOptions opts;
  opts.chunk = int(Q);
  opts.launch.form = form.form;
  opts.launch.allow_tf32 = form.allow_tf32;
  const double chunks = double(B) * H * ((L + Q - 1) / Q);
  kdnn::Matrix<const int, Space> seq_idx;
  if (packed)
    seq_idx = kdnn_bench::packed_ids<Space>(B, kdnn_bench::packed_lengths(int(L), 64, 4096));
  double flop = 0;
  if (!backward) {
    ssm::SsdForward<T, Space> args;
    args.x = x, args.dt = dt, args.A = A, args.B = Bm, args.C = Cm, args.D = D;
    args.seq_idx = seq_idx;
    args.y = kdnn::Tensor4<T, Space>("y", B, L, H, P);
    args.final_state = kdnn::Tensor4<T, Space>("final", B, H, P, N);
    ssm::ssd_forward(space, args, opts);  // warm-up
    space.fence();
    for (auto _ : state) {
      ssm::ssd_forward(space, args, opts);
      space.fence();
    }
    flop = chunks * 2.0 * Q * (2.0 * P * N + Q * double(N + P));
  } else {
    ssm::SsdBackward<T, Space> args;
    args.x = x, args.dt = dt, args.A = A, args.B = Bm, args.C = Cm, args.D = D;
    args.seq_idx = seq_idx;
    args.dy = random_view(kdnn::Tensor4<T, Space>("dy", B, L, H, P), 7);
    args.dx = kdnn::Tensor4<T, Space>("dx", B, L, H, P);
    args.ddt = kdnn::Tensor3<T, Space>("ddt", B, L, H);
    args.dA = kdnn::Vector<T, Space>("dA", H);
    args.dB = kdnn::Tensor4<T, Space>("dB", B, L, G, N);
    args.dC = kdnn::Tensor4<T, Space>("dC", B, L, G, N);
    args.dD = kdnn::Vector<T, Space>("dD", H);
    ssm::ssd_backward(space, args, opts);  // warm-up
    space.fence();
    for (auto _ : state) {
      ssm::ssd_backward(space, args, opts);
      space.fence();
    }
    flop = chunks * 2.0 * Q * (5.0 * P * N + Q * double(3 * N + 2 * P));
  }
  const double R = 4, parts = backward ? 2 : 1;
  state.counters["GFLOP/s"] =
      benchmark::Counter(flop * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["state_bytes_r4"] = (R - 1) * B * H * (1 + parts * P * N) * sizeof(T);
  state.counters["a2a_bytes_r4"] =
      (R - 1) / (R * R) * B * L * double(3 * H * P + 2 * G * N + H) * sizeof(T);
}

}  // namespace

int main(int argc, char** argv) {
  return kdnn_bench::main(
      argc, argv, "2x4096x8x64x64x64,2x16384x8x64x64x64", 6, "BxLxHxPxNxQ", [](const auto& sizes) {
        std::vector<Form> forms{{"automatic", kdnn::KernelForm::automatic, false}};
        if (!kdnn::impl::BackendTraits<Space>::is_host) {
          forms.push_back({"gpu", kdnn::KernelForm::gpu, false});
          forms.push_back({"tensor_cores", kdnn::KernelForm::tensor_cores, false});
          forms.push_back({"tf32", kdnn::KernelForm::tensor_cores, true});
        }
        for (const auto& size : sizes) {
          for (const bool packed : {false, true}) {
            for (const bool backward : {false, true}) {
              for (const Form& form : forms) {
                const std::string name = std::string("ssd_f32/") +
                                         (backward ? "backward" : "forward") +
                                         (packed ? "_packed/" : "/") + form.name;
                benchmark::RegisterBenchmark(name.c_str(), run, backward, form, packed)
                    ->Args(size)
                    ->Unit(benchmark::kMillisecond)
                    ->UseRealTime();
              }
            }
          }
        }
      });
}
