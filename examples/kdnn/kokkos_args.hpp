// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The integer-valued --kokkos-* arguments of the `kdnn` tool, checked before
// Kokkos::initialize: Kokkos parses them with std::stoi and lets its
// exceptions escape (an abort), so a malformed one is a usage error here.
#include <string>

#include "cli.hpp"

namespace kdnn::cli {

/// Throws UsageError when `arg` is one of Kokkos' integer arguments (3.4 and
/// 4.x spellings) without a valid value: "--kokkos-threads: expected
/// --kokkos-threads=N, N an integer >= 1 (at most 2147483647), got
/// '--kokkos-threads=abc'". Counts are >= 1, device ids >= 0;
/// --kokkos-num-devices / --kokkos-ndevices take N[,S] (S the device to
/// skip). Any other argument passes unchecked.
void check_kokkos_arg(const std::string& arg);

}  // namespace kdnn::cli
