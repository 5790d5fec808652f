// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Tensor-core products in a register-tiled team kernel (register_team.hpp):
// a team of NT threads is NT / 32 warps, and team_mma runs one warp-level
// product per warp on fragments its threads hold or load. On a
// GPU each lane issues mma.sync with its own registers
// (warp_mma_device.hpp); on a host the team's one thread plays each warp's
// 32 lanes through the emulation (warp_mma_emulated.hpp), reading the same
// registers through the same fragment maps. Kernel code around it (which
// element goes into which register, where the results are stored) is
// therefore the same on every backend and tested on the CPU.
//
// Precision for float (double is always FP64 on the tensor cores):
//   full: 3×TF32 (tf32.hpp), three products per step, float32 accuracy:
//         the step's three products go into a zeroed fragment, which is
//         then added to C by an ordinary float32 add (round to nearest).
//         A tensor core's own float32 accumulation rounds toward zero, so
//         adding every product into C directly biases C's rounding errors
//         and they grow with the number of steps (measured on an H200:
//         5-9× the error of float32 FMAs in the fused attention, against
//         the emulation's round-to-nearest sums); through the zeroed
//         fragment only each step's partial sum is truncated.
//   tf32: one product of the operands rounded to TF32, about 10 bits
//         (PyTorch's allow_tf32); a caller's explicit choice, never a default.
//
// Order: 3×TF32 adds its two small products in an order that depends on
// which operand is A. A product computed as Cᵀ += Bᵀ·Aᵀ (the backward's
// Sᵀ = K·Qᵀ beside the forward's S = Q·Kᵀ) runs with MmaOrder::transposed:
// the same three sums of the same exact partial products in the same order,
// so its result is bitwise the transpose of the other's (one product's
// terms a_k·b_k do not depend on which operand is which; neither does the
// emulation's sum, nor, as the device check tests, the tensor core's).
#include <Kokkos_Core.hpp>
#include <type_traits>

#include "kdnn/core/impl/tf32.hpp"
#include "kdnn/core/impl/unroll.hpp"
#include "kdnn/core/impl/warp_mma_device.hpp"
#include "kdnn/core/impl/warp_mma_emulated.hpp"
#include "kdnn/core/impl/warp_mma_fragments.hpp"
#include "kdnn/core/launch.hpp"

namespace kdnn::impl {

/// The tensor-core product of T: m16n8k8 TF32 for float, m8n8k4 FP64 for
/// double.
template <class T>
using MmaOf = std::conditional_t<(sizeof(T) > 4), MmaF64M8N8K4, MmaTf32M16N8K8>;

/// How a float product runs on tensor cores (above).
enum class MmaPrecision { full, tf32 };

/// Calls run(p), p the std::integral_constant<MmaPrecision, …> a launch asks
/// for in T: one TF32 pass for float where `launch.allow_tf32` says so, else
/// full (3×TF32 for float, FP64 for double).
template <class T, class Run>
void with_mma_precision(const Launch& launch, const Run& run) {
  if constexpr (sizeof(T) == 4) {
    if (launch.allow_tf32) {
      run(std::integral_constant<MmaPrecision, MmaPrecision::tf32>{});
      return;
    }
  }
  run(std::integral_constant<MmaPrecision, MmaPrecision::full>{});
}

/// The order of 3×TF32's small products (above): `plain` small(A)·big(B)
/// first, as CUTLASS; `transposed` big(A)·small(B) first.
enum class MmaOrder { plain, transposed };

/// One lane's c += a·b of Shape with precision P, on the device (every
/// lane of the warp together): the lane's registers of A, B and C.
template <class Shape, MmaPrecision P, MmaOrder O = MmaOrder::plain, class T>
KOKKOS_FORCEINLINE_FUNCTION void lane_mma(const T (&a)[Shape::a_regs], const T (&b)[Shape::b_regs],
                                          T (&cr)[Shape::c_regs]) {
  T ar[Shape::a_regs], br[Shape::b_regs];
  if constexpr (sizeof(T) > 4) {
    device_mma(Shape{}, a, b, cr);
  } else if constexpr (P == MmaPrecision::tf32) {
    KDNN_IMPL_UNROLL
    for (int r = 0; r < Shape::a_regs; ++r) ar[r] = tf32_rounded(a[r]);
    KDNN_IMPL_UNROLL
    for (int r = 0; r < Shape::b_regs; ++r) br[r] = tf32_rounded(b[r]);
    device_mma(Shape{}, ar, br, cr);
  } else {
    // The small terms first, then big·big (CUTLASS's order).
    T as[Shape::a_regs], bs[Shape::b_regs];
    KDNN_IMPL_UNROLL
    for (int r = 0; r < Shape::a_regs; ++r) {
      const Tf32Split s = tf32_split(a[r]);
      ar[r] = s.big, as[r] = s.small;
    }
    KDNN_IMPL_UNROLL
    for (int r = 0; r < Shape::b_regs; ++r) {
      const Tf32Split s = tf32_split(b[r]);
      br[r] = s.big, bs[r] = s.small;
    }
    T step[Shape::c_regs];
    KDNN_IMPL_UNROLL
    for (int r = 0; r < Shape::c_regs; ++r) step[r] = T(0);
    if constexpr (O == MmaOrder::plain) {
      device_mma(Shape{}, as, br, step);
      device_mma(Shape{}, ar, bs, step);
    } else {
      device_mma(Shape{}, ar, bs, step);
      device_mma(Shape{}, as, br, step);
    }
    device_mma(Shape{}, ar, br, step);
    KDNN_IMPL_UNROLL
    for (int r = 0; r < Shape::c_regs; ++r) cr[r] += step[r];
  }
}

/// lane_mma for a whole warp on the host: a(lane, r), b(lane, r) and
/// c(lane, r) give lane `lane`'s registers; the same steps, each product
/// emulated.
template <class Shape, MmaPrecision P, MmaOrder O = MmaOrder::plain, class A, class B, class C>
KOKKOS_INLINE_FUNCTION void emulated_warp_mma(const A& a, const B& b, const C& c) {
  using T = typename Shape::value_type;
  if constexpr (sizeof(T) > 4) {
    emulated_mma<Shape>(a, b, c);
  } else if constexpr (P == MmaPrecision::tf32) {
    emulated_mma<Shape>([&](int l, int r) { return tf32_rounded(a(l, r)); },
                        [&](int l, int r) { return tf32_rounded(b(l, r)); }, c);
  } else {
    const auto big = [](const auto& x) {
      return [&x](int l, int r) { return tf32_split(x(l, r)).big; };
    };
    const auto small = [](const auto& x) {
      return [&x](int l, int r) { return tf32_split(x(l, r)).small; };
    };
    T step[32][Shape::c_regs] = {};
    const auto s = [&step](int l, int r) -> T& { return step[l][r]; };
    if constexpr (O == MmaOrder::plain) {
      emulated_mma<Shape>(small(a), big(b), s);
      emulated_mma<Shape>(big(a), small(b), s);
    } else {
      emulated_mma<Shape>(big(a), small(b), s);
      emulated_mma<Shape>(small(a), big(b), s);
    }
    emulated_mma<Shape>(big(a), big(b), s);
    for (int l = 0; l < 32; ++l) {
      for (int r = 0; r < Shape::c_regs; ++r) c(l, r) += step[l][r];
    }
  }
}

/// Thread t's registers x(t)[x0 + r] as an operand of team_mma.
template <class Registers>
KOKKOS_INLINE_FUNCTION auto registers_at(Registers& x, int x0) {
  return [&x, x0 ](int t, int r) -> auto& { return x(t)[x0 + r]; };
}

/// For each warp w of a team of NT threads: C_w += A_w·B_w, one product of
/// Shape with precision P, where a(t, r), b(t, r) give thread
/// t = 32·w + lane's register r of A and B (values: from registers, or
/// loaded from scratch where the fragment is needed) and c(t, r) its
/// register r of C (a reference). Private: the team's threads have their
/// own registers (a GPU backend). Call it where every thread of the team
/// would (it is a team-wide step, like threads()). O: MmaOrder above.
template <class Shape, MmaPrecision P, int NT, bool Private, MmaOrder O = MmaOrder::plain,
          class Member, class A, class B, class C>
KOKKOS_INLINE_FUNCTION void team_mma(const Member& team, const A& a, const B& b, const C& c) {
  static_assert(NT % 32 == 0, "team_mma: a team of whole warps");
  using T = typename Shape::value_type;
  if constexpr (Private) {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, NT), [&](int t) {
      T ar[Shape::a_regs], br[Shape::b_regs], cr[Shape::c_regs];
      KDNN_IMPL_UNROLL
      for (int r = 0; r < Shape::a_regs; ++r) ar[r] = a(t, r);
      KDNN_IMPL_UNROLL
      for (int r = 0; r < Shape::b_regs; ++r) br[r] = b(t, r);
      KDNN_IMPL_UNROLL
      for (int r = 0; r < Shape::c_regs; ++r) cr[r] = c(t, r);
      lane_mma<Shape, P, O>(ar, br, cr);
      KDNN_IMPL_UNROLL
      for (int r = 0; r < Shape::c_regs; ++r) c(t, r) = cr[r];
    });
  } else {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, NT / 32), [&](int w) {
      emulated_warp_mma<Shape, P, O>([&](int l, int r) { return a(32 * w + l, r); },
                                     [&](int l, int r) { return b(32 * w + l, r); },
                                     [&](int l, int r) -> T& { return c(32 * w + l, r); });
    });
  }
}

/// Where thread t's A register e of a team's product (mma_rows_by_cols)
/// lies in the team's block of A rows: its row (warp
/// t / 32 owns MT m-tiles of Mma::M rows) and its column among Width,
/// e = (mt·KS + ks)·a_regs + r with KS = Width / Mma::K.
template <class Mma, int MT, int Width>
KOKKOS_FORCEINLINE_FUNCTION FragmentIndex mma_a_place(int t, int e) {
  constexpr int KS = Width / Mma::K;
  const int mt = e / (KS * Mma::a_regs), ks = e / Mma::a_regs % KS;
  const FragmentIndex f = Mma::a(t % 32, e % Mma::a_regs);
  return {(t / 32 * MT + mt) * Mma::M + f.row, ks * Mma::K + f.col};
}

/// acc += A·B over Width = KS·Mma::K, for each warp of a team of NT
/// threads: a(t, e) thread t's A register e (as mma_a_place numbers them),
/// b(t, ks, nc, r) its B register r of k-step ks and 8-column tile nc, acc(t)
/// its NC 8-column accumulator tiles per m-tile, register
/// (mt·NC + nc)·c_regs + r. The sums run over ks in order, each one
/// team_mma; O: MmaOrder above.
template <class Mma, MmaPrecision P, int NT, bool Private, int MT, int NC, int Width,
          MmaOrder O = MmaOrder::plain, class Member, class A, class B, class C>
KOKKOS_INLINE_FUNCTION void mma_rows_by_cols(const Member& team, const A& a, const B& b, C& acc) {
  constexpr int KS = Width / Mma::K, AR = Mma::a_regs, CR = Mma::c_regs;
  static_assert(Width % Mma::K == 0, "mma_rows_by_cols: whole k-steps");
  KDNN_IMPL_UNROLL
  for (int ks = 0; ks < KS; ++ks) {
    KDNN_IMPL_UNROLL
    for (int nc = 0; nc < NC; ++nc) {
      const auto br = [&](int t, int r) { return b(t, ks, nc, r); };
      KDNN_IMPL_UNROLL
      for (int mt = 0; mt < MT; ++mt) {
        const auto ar = [&](int t, int r) { return a(t, (mt * KS + ks) * AR + r); };
        team_mma<Mma, P, NT, Private, O>(team, ar, br, registers_at(acc, (mt * NC + nc) * CR));
      }
    }
  }
}

/// acc = A·tileᵀ (mma_rows_by_cols from zero), `tile` the [NK·8, ld]
/// scratch rows the product takes, k contiguous in a row.
template <class Mma, MmaPrecision P, int NT, bool Private, int MT, int NK, int Width,
          MmaOrder O = MmaOrder::plain, class Member, class A, class C>
KOKKOS_INLINE_FUNCTION void mma_rows_by_tile(const Member& team, const A& a,
                                             const typename Mma::value_type* tile, int ld, C& acc) {
  using T = typename Mma::value_type;
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, NT), [&](int t) {
    KDNN_IMPL_UNROLL
    for (int e = 0; e < MT * NK * Mma::c_regs; ++e) acc(t)[e] = T(0);
  });
  const auto b = [&](int t, int ks, int nk, int r) {
    const FragmentIndex e = Mma::b(t % 32, r);
    return tile[(nk * 8 + e.col) * ld + ks * Mma::K + e.row];
  };
  mma_rows_by_cols<Mma, P, NT, Private, MT, NK, Width, O>(team, a, b, acc);
}

/// acc += A·rows (mma_rows_by_cols), `rows` the [Width, ld] scratch tile of
/// B itself, row k holding the columns contiguously.
template <class Mma, MmaPrecision P, int NT, bool Private, int MT, int NC, int Width,
          MmaOrder O = MmaOrder::plain, class Member, class A, class C>
KOKKOS_INLINE_FUNCTION void mma_add_rows_product(const Member& team, const A& a,
                                                 const typename Mma::value_type* rows, int ld,
                                                 C& acc) {
  const auto b = [&](int t, int ks, int nc, int r) {
    const FragmentIndex e = Mma::b(t % 32, r);
    return rows[(ks * Mma::K + e.row) * ld + nc * 8 + e.col];
  };
  mma_rows_by_cols<Mma, P, NT, Private, MT, NC, Width, O>(team, a, b, acc);
}

}  // namespace kdnn::impl
