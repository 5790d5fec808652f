// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The SSD's skip term D·x: D of length H (one value per head) or H·P (one
// per channel, row-major [H, P], as mamba's D of shape (nheads, headdim)),
// or none. Kernels take a head's row once and read it per channel.
#include <Kokkos_Core.hpp>

#include "kdnn/core/tensor.hpp"

namespace kdnn::ssm::impl {

/// Head h's skip weights: at(p) = D[h] or D[h·P + p]; 0 without D.
template <class T>
struct SkipRow {
  const T* d = nullptr;  ///< the head's first weight; null: no skip
  int step = 0;          ///< 0: one weight per head, 1: per channel

  KOKKOS_FORCEINLINE_FUNCTION T at(int p) const { return d ? d[p * step] : T(0); }
};

template <class ExecSpace, class T>
struct SsdSkip {
  Vector<const T, ExecSpace> D;  ///< [H], [H·P] or empty
  bool per_channel = false;      ///< D has H·P values

  SsdSkip() = default;
  /// D for H heads of P channels (its length checked by the caller).
  SsdSkip(const Vector<const T, ExecSpace>& d, std::size_t H, std::size_t P)
      : D(d), per_channel(d.extent(0) > 0 && d.extent(0) == H * P && P != 1) {}

  KOKKOS_INLINE_FUNCTION SkipRow<T> row(int h, int P) const {
    if (D.extent(0) == 0) return {};
    return per_channel ? SkipRow<T>{D.data() + std::size_t(h) * P, 1} : SkipRow<T>{D.data() + h, 0};
  }
};

}  // namespace kdnn::ssm::impl
