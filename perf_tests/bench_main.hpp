// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The main of every kdnn benchmark: --kdnn_sizes taken out of argv
// (bench_args.hpp), Kokkos initialised with the rest, the benchmarks
// registered for those sizes, Google Benchmark run on what it selects.
#include <benchmark/benchmark.h>

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "bench_args.hpp"

namespace kdnn_bench {

/// Runs `register_all(sizes)` (sizes: `rank` numbers each, from --kdnn_sizes
/// or `fallback`; `format` names them) between Kokkos' initialisation and
/// Google Benchmark's, then the selected benchmarks. A bad size (from
/// parse_args or thrown by register_all) exits 2 with its message.
template <class Register>
int main(int argc, char** argv, const std::string& fallback, std::size_t rank, const char* format,
         const Register& register_all) {
  const char* program = argc > 0 ? argv[0] : "benchmark";
  Args args;
  try {
    args = parse_args(argc, argv, fallback, rank, format);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return 2;
  }
  int count = int(args.rest.size());
  Kokkos::ScopeGuard kokkos(count, args.rest.data());
  try {
    register_all(args.sizes);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return 2;
  }
  benchmark::Initialize(&count, args.rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace kdnn_bench
