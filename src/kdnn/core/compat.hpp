// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The few spellings that differ between Kokkos 3.4 (the distribution's) and
// Kokkos 4.x. Kernels use kdnn::compat::exp etc., never the namespaced
// Kokkos functions directly.
#include <Kokkos_Core.hpp>

#include <cstdlib>
#include <string>
#include <vector>

namespace kdnn::compat {

#if KOKKOS_VERSION >= 40000
using Kokkos::exp;
using Kokkos::fabs;
using Kokkos::log;
using Kokkos::log1p;
using Kokkos::sqrt;
using Kokkos::tanh;
#else
using Kokkos::Experimental::exp;
using Kokkos::Experimental::fabs;
using Kokkos::Experimental::log;
using Kokkos::Experimental::log1p;
using Kokkos::Experimental::sqrt;
using Kokkos::Experimental::tanh;
#endif

/// Kokkos::initialize with Kokkos' warnings off (they go to stderr, e.g. the
/// OpenMP backend's "OMP_PROC_BIND environment variable not set" in 4.x),
/// honouring the program's --kokkos-* arguments `kokkos_args`; their names
/// are Kokkos' own (the thread count is --kokkos-threads=N in 3.4,
/// --kokkos-num-threads=N in 4.x). Both versions know the flag
/// --kokkos-disable-warnings; it is not added when KOKKOS_DISABLE_WARNINGS is
/// set, since the user chose then (and 3.4 aborts when the two disagree).
inline void initialize_without_warnings(const std::string& program,
                                        std::vector<std::string> kokkos_args) {
  if (std::getenv("KOKKOS_DISABLE_WARNINGS") == nullptr) {
    kokkos_args.insert(kokkos_args.begin(), "--kokkos-disable-warnings");
  }
  kokkos_args.insert(kokkos_args.begin(), program);
  std::vector<char*> argv;
  for (std::string& arg : kokkos_args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  int argc = static_cast<int>(argv.size()) - 1;
  Kokkos::initialize(argc, argv.data());
}

}  // namespace kdnn::compat
