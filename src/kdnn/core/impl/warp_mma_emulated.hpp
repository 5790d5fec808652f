// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The host's twin of a warp's tensor-core product (warp_mma_fragments.hpp):
// one thread plays the 32 lanes, each lane's registers as the device holds
// them, so fragment code is tested on every backend.
#include <Kokkos_Core.hpp>

#include "kdnn/core/impl/tf32.hpp"
#include "kdnn/core/impl/warp_mma_fragments.hpp"

namespace kdnn::impl {

/// A warp's registers of one operand: lane by lane, register by register.
template <class T, int Regs>
using WarpFragment = T[32][Regs];

/// How an operand of Shape's type enters the product: TF32 reads a float
/// through its top bits; float64 as it is.
template <class Shape>
KOKKOS_INLINE_FUNCTION typename Shape::value_type mma_operand(typename Shape::value_type x) {
  if constexpr (sizeof(typename Shape::value_type) == 4) {
    return tf32_truncated(x);
  } else {
    return x;
  }
}

/// c(lane, r) += (a·b)(lane, r) for one warp's fragments, as mma.sync of
/// Shape computes it, on the host: a(lane, r) and b(lane, r) give the
/// operands' registers, read as the tensor core reads them; each element
/// of the result is summed in double in k order and rounded once. Exact,
/// and so equal to the device's, when every product and partial sum is
/// exact in the value type (integer-valued data); otherwise the device's
/// sum may differ in its last bits.
template <class Shape, class A, class B, class C>
KOKKOS_INLINE_FUNCTION void emulated_mma(const A& a, const B& b, const C& c) {
  using T = typename Shape::value_type;
  T am[Shape::M][Shape::K] = {}, bm[Shape::K][Shape::N] = {};
  for (int lane = 0; lane < 32; ++lane) {
    for (int r = 0; r < Shape::a_regs; ++r) {
      const FragmentIndex i = Shape::a(lane, r);
      am[i.row][i.col] = mma_operand<Shape>(a(lane, r));
    }
    for (int r = 0; r < Shape::b_regs; ++r) {
      const FragmentIndex i = Shape::b(lane, r);
      bm[i.row][i.col] = mma_operand<Shape>(b(lane, r));
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    for (int r = 0; r < Shape::c_regs; ++r) {
      const FragmentIndex i = Shape::c(lane, r);
      T& out = c(lane, r);
      double sum = out;
      for (int k = 0; k < Shape::K; ++k) sum += double(am[i.row][k]) * double(bm[k][i.col]);
      out = T(sum);
    }
  }
}

/// d = a·b + c on whole-warp arrays (emulated_mma above).
template <class Shape>
void emulated_mma(const WarpFragment<typename Shape::value_type, Shape::a_regs>& a,
                  const WarpFragment<typename Shape::value_type, Shape::b_regs>& b,
                  const WarpFragment<typename Shape::value_type, Shape::c_regs>& c,
                  WarpFragment<typename Shape::value_type, Shape::c_regs>& d) {
  for (int lane = 0; lane < 32; ++lane) {
    for (int r = 0; r < Shape::c_regs; ++r) d[lane][r] = c[lane][r];
  }
  emulated_mma<Shape>([&](int lane, int r) { return a[lane][r]; },
                      [&](int lane, int r) { return b[lane][r]; },
                      [&](int lane, int r) -> auto& { return d[lane][r]; });
}

}  // namespace kdnn::impl
