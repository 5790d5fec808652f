// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The multi-head attention layer's own elementwise kernels: moving heads
// between the projection layout [B, S, H·D] and the per-head layout
// [B, H, S, D], and the output rows' residual and padding.
#include <Kokkos_Core.hpp>
#include <cstddef>

#include "kdnn/attention/types.hpp"
#include "kdnn/core/impl/backend_traits.hpp"
#include "kdnn/core/impl/host_simd.hpp"

namespace kdnn::attention::impl {

/// heads[b, h, s, d] = x[b, s, h·D + d]  (x [B, S, H·D], heads [B, H, S, D]).
/// On a GPU one element per thread (consecutive threads, consecutive d:
/// coalesced on both sides); on a host one row of D per iteration, a
/// contiguous copy instead of three 64-bit divisions per element.
template <class ExecSpace, class T>
void split_heads(const ExecSpace& space, const Tensor3<const T, ExecSpace>& x,
                 const Tensor4<T, ExecSpace>& heads) {
  const std::size_t H = heads.extent(1), S = heads.extent(2), D = heads.extent(3);
  if (heads.size() == 0) return;
  T* out = heads.data();
  if constexpr (kdnn::impl::BackendTraits<ExecSpace>::is_host) {
    Kokkos::parallel_for(
        "kdnn::attention::split_heads", Kokkos::RangePolicy<ExecSpace>(space, 0, heads.size() / D),
        KOKKOS_LAMBDA(std::size_t row) {  // row = (b·H + h)·S + s
          const std::size_t s = row % S, bh = row / S;
          const T* from = &x(bh / H, s, bh % H * D);
          T* to = out + row * D;
          KDNN_IMPL_INDEPENDENT_ITERATIONS
          for (std::size_t d = 0; d < D; ++d) to[d] = from[d];
        });
  } else {
    Kokkos::parallel_for(
        "kdnn::attention::split_heads", Kokkos::RangePolicy<ExecSpace>(space, 0, heads.size()),
        KOKKOS_LAMBDA(std::size_t idx) {  // idx = ((b·H + h)·S + s)·D + d
          const std::size_t d = idx % D, s = idx / D % S, bh = idx / (D * S);
          out[idx] = x(bh / H, s, bh % H * D + d);
        });
  }
}

/// x[b, s, h·D + d] = heads[b, h, s, d]: split_heads' inverse, laid out the
/// same way on each backend.
template <class ExecSpace, class T>
void merge_heads(const ExecSpace& space, const Tensor4<const T, ExecSpace>& heads,
                 const Tensor3<T, ExecSpace>& x) {
  const std::size_t H = heads.extent(1), S = heads.extent(2), D = heads.extent(3);
  if (x.size() == 0) return;
  T* out = x.data();
  if constexpr (kdnn::impl::BackendTraits<ExecSpace>::is_host) {
    Kokkos::parallel_for(
        "kdnn::attention::merge_heads", Kokkos::RangePolicy<ExecSpace>(space, 0, x.size() / D),
        KOKKOS_LAMBDA(std::size_t row) {  // row = (b·S + s)·H + h
          const std::size_t h = row % H, bs = row / H;
          const T* from = &heads(bs / S, h, bs % S, 0);
          T* to = out + row * D;
          KDNN_IMPL_INDEPENDENT_ITERATIONS
          for (std::size_t d = 0; d < D; ++d) to[d] = from[d];
        });
  } else {
    Kokkos::parallel_for(
        "kdnn::attention::merge_heads", Kokkos::RangePolicy<ExecSpace>(space, 0, x.size()),
        KOKKOS_LAMBDA(std::size_t idx) {  // idx = (b·S + s)·H·D + h·D + d
          const std::size_t hd = idx % (H * D), bs = idx / (H * D);
          out[idx] = heads(bs / S, hd / D, bs % S, hd % D);
        });
  }
}

/// out[b, i, :] = 0 for a padded query (i >= seq_q[b], when seq_q is given),
/// else in[b, i, :] (+ residual[b, i, :] when given). `in` may be `out`.
template <class ExecSpace, class T>
void output_rows(const ExecSpace& space, const Tensor3<const T, ExecSpace>& in,
                 const Tensor3<const T, ExecSpace>& residual,
                 const Vector<const int, ExecSpace>& seq_q, const Tensor3<T, ExecSpace>& out) {
  const std::size_t S = out.extent(1), E = out.extent(2);
  const bool add = residual.data() != nullptr, padded = seq_q.extent(0) > 0;
  if (out.size() == 0) return;
  Kokkos::parallel_for(
      "kdnn::attention::output_rows", Kokkos::RangePolicy<ExecSpace>(space, 0, out.size()),
      KOKKOS_LAMBDA(std::size_t idx) {  // idx = (b·S + i)·E + e
        const std::size_t b = idx / (S * E), i = idx / E % S;
        T value = T(0);
        if (!padded || int(i) < seq_q(b)) {
          value = in.data()[idx];
          if (add) value += residual.data()[idx];
        }
        out.data()[idx] = value;
      });
}

}  // namespace kdnn::attention::impl
