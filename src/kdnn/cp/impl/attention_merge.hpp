// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// How context-parallel attention combines the attention of a block of
// queries over separate blocks of keys: each block's (O_b, lse_b), softmax-
// normalised over its own keys, merges into the running (O, lse) by their
// log-sum-exp,
//   lse' = log(e^lse + e^lse_b),  O' = O·e^{lse − lse'} + O_b·e^{lse_b − lse'},
// in the compute precision T, with the larger of the two taken out first; a
// row that has seen no key on either side (both −inf) stays (0, −inf), and
// one side's −inf gives the other side exactly (never NaN). Attention sinks
// join once, at the end, as a block with no value: lse' = log(e^lse +
// e^sink), O' = O·e^{lse − lse'}.
#include <Kokkos_Core.hpp>
#include <limits>

#include "kdnn/core/compat.hpp"
#include "kdnn/core/tensor.hpp"

namespace kdnn::cp::impl {

/// (o, lse)'s rows first … first + n − 1 ← merged with (o_b, lse_b) [B, H, n, ·].
template <class ExecSpace, class T>
void merge_block(const ExecSpace& space, const StridedTensor4<T, ExecSpace>& o,
                 const Tensor3<T, ExecSpace>& lse, int first,
                 const StridedTensor4<const T, ExecSpace>& o_b,
                 const Tensor3<const T, ExecSpace>& lse_b) {
  const int B = int(o_b.extent(0)), H = int(o_b.extent(1)), n = int(o_b.extent(2));
  const int Dv = int(o_b.extent(3));
  if (std::size_t(B) * H * n == 0) return;
  const T neg_inf = -std::numeric_limits<T>::infinity();
  Kokkos::parallel_for(
      "kdnn::cp::merge_attention_block",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>>(space, {0, 0, 0}, {B, H, n}),
      KOKKOS_LAMBDA(int b, int h, int r) {
        const T a = lse(b, h, first + r), c = lse_b(b, h, r);
        const T m = a > c ? a : c;
        if (m == neg_inf) return;  // neither saw a key
        const T wa = compat::exp(a - m), wc = compat::exp(c - m), sum = wa + wc;
        for (int e = 0; e < Dv; ++e) {
          o(b, h, first + r, e) = (o(b, h, first + r, e) * wa + o_b(b, h, r, e) * wc) / sum;
        }
        lse(b, h, first + r) = m + compat::log(sum);
      });
}

/// Every row of (o, lse) [B, H, L, ·] ← merged with head h's sink logit.
template <class ExecSpace, class T>
void merge_sinks(const ExecSpace& space, const StridedTensor4<T, ExecSpace>& o,
                 const Tensor3<T, ExecSpace>& lse, const Vector<const T, ExecSpace>& sinks) {
  const int B = int(o.extent(0)), H = int(o.extent(1)), L = int(o.extent(2));
  const int Dv = int(o.extent(3));
  if (std::size_t(B) * H * L == 0) return;
  const T neg_inf = -std::numeric_limits<T>::infinity();
  Kokkos::parallel_for(
      "kdnn::cp::merge_attention_sinks",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>>(space, {0, 0, 0}, {B, H, L}),
      KOKKOS_LAMBDA(int b, int h, int r) {
        const T a = lse(b, h, r), c = sinks(h);
        const T m = a > c ? a : c;
        if (m == neg_inf) return;  // a sink of −inf: none
        const T wa = compat::exp(a - m), sum = wa + compat::exp(c - m);
        for (int e = 0; e < Dv; ++e) o(b, h, r, e) = o(b, h, r, e) * (wa / sum);
        lse(b, h, r) = m + compat::log(sum);
      });
}

}  // namespace kdnn::cp::impl
