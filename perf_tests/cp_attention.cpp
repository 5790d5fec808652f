// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Context-parallel fused attention (kdnn/cp/attention.hpp), forward +
// backward, against the single-rank operator on the whole sequence: run
// under mpiexec with one thread per rank (a Serial build, or
// OMP_NUM_THREADS=1). Rank 0 first times the whole sequence alone (the
// other ranks wait), then every rank the whole sequence at once (the
// "crowded" time: what sharing the memory bandwidth and caches costs), then
// every rank its share under each layout; a time is the slowest rank's,
// the median of the repeats. Prints per layout the time, the efficiency
// (single-rank time / R / cp time, and against the crowded time), the bytes each
// rank sent against the ring's formula, the seconds the exchange
// overlapped and waited, and each rank's peak memory: the process's
// resident set (VmHWM: the libraries' own included) and the peak of what it
// allocated through Kokkos (the call's tensors and every buffer of the
// library), against the target 1/R of the single rank's plus two K/V blocks.
//
//   mpiexec -n 2 kdnn_perf_cp_attention [S [B H Hkv D [repeats [causal [f64]]]]]
//   (default 8192 1 8 8 64 3 1 0)
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <Kokkos_Random.hpp>
#include <cmath>

#include "allocation_counter.hpp"
#include "kdnn/attention/fused_attention.hpp"
#include "kdnn/cp/cp.hpp"

namespace {

namespace at = kdnn::attention;
namespace cp = kdnn::cp;
using Space = Kokkos::DefaultExecutionSpace;

struct Size {
  int S = 8192, B = 1, H = 8, Hkv = 8, D = 64, repeats = 3;
  bool causal = true, f64 = false;
};

/// Resets the process's peak resident set to its current size (Linux's
/// clear_refs 5), so that peak_mib() measures what follows.
void reset_peak() { std::ofstream("/proc/self/clear_refs") << "5"; }

/// The process's peak resident set (VmHWM), MiB.
double peak_mib() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "VmHWM:") {
      double kib = 0;
      status >> kib;
      return kib / 1024;
    }
    status.ignore(1 << 20, '\n');
  }
  return 0;
}

/// Median of the slowest rank's seconds over the repeats of `run`.
template <class Run>
double median_seconds(MPI_Comm comm, int repeats, const Run& run) {
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) {
    MPI_Barrier(comm);
    const double t0 = MPI_Wtime();
    run();
    Space().fence();
    double mine = MPI_Wtime() - t0, slowest = 0;
    MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm);
    times.push_back(slowest);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

template <class T>
void run(const Size& z) {
  int rank = 0, R = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &R);
  at::FusedAttentionOptions opts;
  opts.scale = 1.0 / std::sqrt(double(z.D));
  at::AttentionMask<Space> mask;
  mask.causal = z.causal;
  const auto filled = [](Kokkos::View<T****, Kokkos::LayoutRight, Space> v, unsigned seed) {
    Kokkos::Random_XorShift64_Pool<Space> pool(seed);
    Kokkos::fill_random(v, pool, T(-1), T(1));
    return v;
  };
  // The whole sequence on rank 0 alone, then on every rank at once (what the
  // ranks' sharing of the memory bandwidth and caches costs).
  double single = 0, crowded = 0, single_mib = 0;
  constexpr double MiB = 1024.0 * 1024.0;
  {
    const kdnn_test::AllocationCounter allocated;
    const int n = z.S;
    Kokkos::View<T****, Kokkos::LayoutRight, Space> q("q", z.B, z.H, n, z.D),
        k("k", z.B, z.Hkv, n, z.D), v("v", z.B, z.Hkv, n, z.D), o("o", z.B, z.H, n, z.D),
        dout("dout", z.B, z.H, n, z.D), dq("dq", z.B, z.H, n, z.D), dk("dk", z.B, z.Hkv, n, z.D),
        dv("dv", z.B, z.Hkv, n, z.D);
    Kokkos::View<T***, Kokkos::LayoutRight, Space> lse("lse", z.B, z.H, n);
    filled(q, 1), filled(k, 2), filled(v, 3), filled(dout, 4);
    const auto whole = [&] {
      at::fused_attention_forward(Space(),
                                  at::FusedAttentionForward<T, Space>{q, k, v, o, lse, mask}, opts);
      at::fused_attention_backward(
          Space(), at::FusedAttentionBackward<T, Space>{q, k, v, o, lse, dout, dq, dk, dv, mask},
          opts);
    };
    single = median_seconds(MPI_COMM_WORLD, z.repeats, [&] {
      if (rank == 0) whole();
    });
    crowded = median_seconds(MPI_COMM_WORLD, z.repeats, whole);
    single_mib = double(allocated.peak) / MiB;
  }
  // Two K/V blocks: B·Hkv·(S/R)·(D + Dv) values each.
  const double kv_block_mib = double(z.B) * z.Hkv * (double(z.S) / R) * 2 * z.D * sizeof(T) / MiB;
  const double target_mib = single_mib / R + 2 * kv_block_mib;
  if (rank == 0) {
    std::printf(
        "cp attention fwd+bwd %s S=%d B=%d H=%d Hkv=%d D=%d %s, %d rank(s), 1 thread each\n",
        z.causal ? "causal" : "full", z.S, z.B, z.H, z.Hkv, z.D,
        sizeof(T) == 8 ? "float64" : "float32", R);
    std::printf(
        "  single rank, whole sequence: %.3f s alone, %.3f s with every rank doing the same; ideal "
        "per rank: %.3f s (1/R of alone), %.3f s (1/R of crowded)\n",
        single, crowded, single / R, crowded / R);
    std::printf(
        "  allocated through Kokkos, single rank: %.1f MiB; target per rank: %.1f MiB (1/R of it "
        "plus two K/V blocks of %.1f MiB)\n",
        single_mib, target_mib, kv_block_mib);
  }
  const std::pair<const char*, cp::AttentionComm> runs[] = {
      {"load_balanced", cp::AttentionComm::ring},
      {"contiguous", cp::AttentionComm::ring},
      {"load_balanced", cp::AttentionComm::all_gather},
      {"load_balanced", cp::AttentionComm::all_to_all}};
  for (const auto& [name, comm] : runs) {
    reset_peak();
    const kdnn_test::AllocationCounter allocated;
    const cp::CpAttentionOptions how{comm};
    const char* how_name = comm == cp::AttentionComm::ring         ? "ring"
                           : comm == cp::AttentionComm::all_gather ? "all_gather"
                                                                   : "all_to_all";
    const auto layout = std::string(name) == "contiguous"
                            ? cp::SequenceLayout::contiguous(
                                  std::vector<std::int64_t>(std::size_t(R), std::int64_t(z.S / R)))
                            : cp::SequenceLayout::load_balanced(z.S / R * R, R);
    const int n = int(layout.local_steps(rank));
    Kokkos::View<T****, Kokkos::LayoutRight, Space> q("q", z.B, z.H, n, z.D),
        k("k", z.B, z.Hkv, n, z.D), v("v", z.B, z.Hkv, n, z.D), o("o", z.B, z.H, n, z.D),
        dout("dout", z.B, z.H, n, z.D), dq("dq", z.B, z.H, n, z.D), dk("dk", z.B, z.Hkv, n, z.D),
        dv("dv", z.B, z.Hkv, n, z.D);
    Kokkos::View<T***, Kokkos::LayoutRight, Space> lse("lse", z.B, z.H, n);
    filled(q, 11 + rank), filled(k, 21 + rank), filled(v, 31 + rank), filled(dout, 41 + rank);
    cp::ExchangeStats f, b;
    const double t = median_seconds(MPI_COMM_WORLD, z.repeats, [&] {
      f = cp::fused_attention_forward(Space(), MPI_COMM_WORLD, layout,
                                      at::FusedAttentionForward<T, Space>{q, k, v, o, lse, mask},
                                      opts, how);
      b = cp::fused_attention_backward(
          Space(), MPI_COMM_WORLD, layout,
          at::FusedAttentionBackward<T, Space>{q, k, v, o, lse, dout, dq, dk, dv, mask}, opts, how);
    });
    // The ring's forward: R − 1 blocks of B·Hkv·L·2D values.
    const double formula =
        double(R - 1) * z.B * z.Hkv * (double(z.S) / R) * 2 * z.D * double(sizeof(T));
    std::vector<double> mine = {double(f.bytes_sent),
                                double(b.bytes_sent),
                                f.overlapped_seconds + b.overlapped_seconds,
                                f.waited_seconds + b.waited_seconds,
                                peak_mib(),
                                double(allocated.peak) / MiB};
    std::vector<double> all(mine.size() * std::size_t(R));
    MPI_Gather(mine.data(), int(mine.size()), MPI_DOUBLE, all.data(), int(mine.size()), MPI_DOUBLE,
               0, MPI_COMM_WORLD);
    if (rank != 0) continue;
    std::printf(
        "  %-13s %-10s %.3f s (%.2fx the ideal, efficiency %.0f %%; %.0f %% of the crowded "
        "ideal)\n",
        name, how_name, t, t / (single / R), 100.0 * single / R / t, 100.0 * crowded / R / t);
    for (int r = 0; r < R; ++r) {
      const double* x = &all[std::size_t(r) * mine.size()];
      std::printf(
          "    rank %d: sent %.0f B forward (ring formula %.0f), %.0f B backward; exchange "
          "overlapped "
          "%.3f s, waited %.3f s; peak memory %.0f MiB resident, %.1f MiB allocated (%.2fx the "
          "target)\n",
          r, x[0], formula, x[1], x[2], x[3], x[4], x[5], x[5] / target_mib);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Size z;
  int* fields[] = {&z.S, &z.B, &z.H, &z.Hkv, &z.D, &z.repeats};
  for (int i = 1; i < argc && i <= 6; ++i) *fields[i - 1] = std::atoi(argv[i]);
  if (argc > 7) z.causal = std::atoi(argv[7]) != 0;
  if (argc > 8) z.f64 = std::atoi(argv[8]) != 0;
  int status = 0;
  try {
    Kokkos::initialize(argc, argv);
    if (z.f64) {
      run<double>(z);
    } else {
      run<float>(z);
    }
    Kokkos::finalize();
  } catch (const std::exception& e) {  // a kdnn::Error: the same on every rank
    std::fprintf(stderr, "kdnn_perf_cp_attention: %s\n", e.what());
    status = 1;
  }
  MPI_Finalize();
  return status;
}
