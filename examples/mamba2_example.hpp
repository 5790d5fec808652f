// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// What the two Mamba-2 context-parallel examples (mamba2_cp_conv.cpp,
// mamba2_cp_block.cpp) share: double Views in the default execution space's
// memory, random inputs that are the same on every rank, slices of steps and
// channels as new tensors, and the largest difference of two tensors.
#pragma once
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <random>
#include <string>
#include <utility>

namespace mamba2_example {

using Space = Kokkos::DefaultExecutionSpace;
using T = double;
template <class D>
using View = Kokkos::View<D, Kokkos::LayoutRight, Space::memory_space>;

/// A [B, L, E] tensor of uniform values in [lo, hi), the same on every rank.
View<T***> random3(const char* name, int B, int L, int E, unsigned seed, double lo = -1,
                   double hi = 1) {
  View<T***> v(std::string(name), B, L, E);
  auto h = Kokkos::create_mirror_view(v);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  for (std::size_t k = 0; k < h.size(); ++k) h.data()[k] = dist(gen);
  Kokkos::deep_copy(v, h);
  return v;
}

/// Steps [first, first + n) of a [B, L, E] tensor, as a new tensor.
View<T***> steps(const View<T***>& v, int first, int n) {
  View<T***> out(std::string(v.label()) + "_steps", v.extent(0), n, v.extent(2));
  Kokkos::deep_copy(out,
                    Kokkos::subview(v, Kokkos::ALL, std::make_pair(first, first + n), Kokkos::ALL));
  return out;
}

/// Channels [c0, c0 + E) of a [B, L, C] tensor as a contiguous [B, L, E].
View<T***> channels(const View<T***>& v, int c0, int E) {
  View<T***> out(std::string(v.label()) + "_channels", v.extent(0), v.extent(1), E);
  Kokkos::deep_copy(out, Kokkos::subview(v, Kokkos::ALL, Kokkos::ALL, std::make_pair(c0, c0 + E)));
  return out;
}

/// A contiguous [B, L, E·F] tensor seen as [B, L, E, F].
View<T****> split_last(const View<T***>& v, int E, int F) {
  return View<T****>(v.data(), v.extent(0), v.extent(1), E, F);
}

/// max |a − b| over the elements.
template <class V>
double max_diff(const V& a, const V& b) {
  auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a);
  auto hb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b);
  double d = 0;
  for (std::size_t k = 0; k < ha.size(); ++k)
    d = std::max(d, std::abs(ha.data()[k] - hb.data()[k]));
  return d;
}

}  // namespace mamba2_example
