// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The packings the benchmarks of packed sequences run: lengths drawn
// uniformly from [lo, hi] (seed 7, the same in every run) until they total
// `total` steps, the last one cut to fit; as offsets (cu_seqlens) or as
// per-step sequence ids (seq_idx). The draw is spelled out (std::mt19937's
// outputs, which the standard fixes, mapped by uniform() below, where
// std::uniform_int_distribution's mapping is the library's own), so that
// packed_lengths.py gives the Python comparisons the same lengths.
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

namespace kdnn_bench {

/// An integer of [lo, hi] from gen's 32-bit outputs by Lemire's
/// multiply-and-reject: the high word of output·span, an output being drawn
/// again while the low word is below 2^32 mod span (which would bias it).
inline int uniform(std::mt19937& gen, int lo, int hi) {
  const std::uint64_t span = std::uint64_t(hi - lo) + 1;
  const std::uint64_t threshold = ((std::uint64_t(1) << 32) - span) % span;
  std::uint64_t product = std::uint64_t(gen()) * span;
  while ((product & 0xFFFFFFFFu) < threshold) product = std::uint64_t(gen()) * span;
  return lo + int(product >> 32);
}

inline std::vector<int> packed_lengths(int total, int lo, int hi) {
  std::mt19937 gen(7);
  std::vector<int> lengths;
  for (int sum = 0; sum < total;) {
    lengths.push_back(std::min(uniform(gen, lo, hi), total - sum));
    sum += lengths.back();
  }
  return lengths;
}

/// The offsets [N + 1] of `lengths` on the device.
template <class Space>
Kokkos::View<int*, Kokkos::LayoutRight, Space> packed_offsets(const std::vector<int>& lengths) {
  Kokkos::View<int*, Kokkos::LayoutRight, Space> cu("cu_seqlens", lengths.size() + 1);
  const auto host = Kokkos::create_mirror_view(cu);
  host(0) = 0;
  for (std::size_t n = 0; n < lengths.size(); ++n) host(n + 1) = host(n) + lengths[n];
  Kokkos::deep_copy(cu, host);
  return cu;
}

/// seq_idx [B, L] on the device: every row packs `lengths` (totalling L).
template <class Space>
Kokkos::View<int**, Kokkos::LayoutRight, Space> packed_ids(std::size_t B,
                                                           const std::vector<int>& lengths) {
  std::size_t L = 0;
  for (const int n : lengths) L += std::size_t(n);
  Kokkos::View<int**, Kokkos::LayoutRight, Space> ids("seq_idx", B, L);
  const auto host = Kokkos::create_mirror_view(ids);
  for (std::size_t b = 0; b < B; ++b) {
    std::size_t t = 0;
    for (std::size_t n = 0; n < lengths.size(); ++n)
      for (int i = 0; i < lengths[n]; ++i) host(b, t++) = int(n);
  }
  Kokkos::deep_copy(ids, host);
  return ids;
}

}  // namespace kdnn_bench
