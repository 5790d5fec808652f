// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The register fragments of the warp-level tensor-core products kdnn uses,
// from the PTX ISA ("Matrix Fragments for mma.m16n8k8", .tf32, and "for
// mma.m8n8k4 with .f64"): which element of A (M×K), B (K×N) and C or D
// (M×N) lane `lane` of the warp holds in its register r. With g = lane / 4
// and t = lane % 4:
//   m16n8k8, tf32:  A a0..a3 → (g + 8·(r mod 2), t + 4·⌊r/2⌋)
//                   B b0, b1 → (t + 4·r, g)
//                   C c0..c3 → (g + 8·⌊r/2⌋, 2t + r mod 2)
//   m8n8k4, f64:    A a0 → (g, t);  B b0 → (t, g);  C c0, c1 → (g, 2t + r)
// The device's mma.sync and the host's emulation (warp_mma_emulated.hpp)
// both read and write fragments through these maps, so the code that loads,
// reorders and stores fragments is the same on every backend.
#include <Kokkos_Core.hpp>

namespace kdnn::impl {

/// The (row, column) of one fragment register in its matrix.
struct FragmentIndex {
  int row;
  int col;
};

/// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32: float operands read
/// as TF32, float accumulators.
struct MmaTf32M16N8K8 {
  using value_type = float;
  static constexpr int M = 16, N = 8, K = 8;
  static constexpr int a_regs = 4, b_regs = 2, c_regs = 4;
  KOKKOS_INLINE_FUNCTION static constexpr FragmentIndex a(int lane, int r) {
    return {lane / 4 + 8 * (r % 2), lane % 4 + 4 * (r / 2)};
  }
  KOKKOS_INLINE_FUNCTION static constexpr FragmentIndex b(int lane, int r) {
    return {lane % 4 + 4 * r, lane / 4};
  }
  KOKKOS_INLINE_FUNCTION static constexpr FragmentIndex c(int lane, int r) {
    return {lane / 4 + 8 * (r / 2), 2 * (lane % 4) + r % 2};
  }
};

/// mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64.
struct MmaF64M8N8K4 {
  using value_type = double;
  static constexpr int M = 8, N = 8, K = 4;
  static constexpr int a_regs = 1, b_regs = 1, c_regs = 2;
  KOKKOS_INLINE_FUNCTION static constexpr FragmentIndex a(int lane, int /*r*/) {
    return {lane / 4, lane % 4};
  }
  KOKKOS_INLINE_FUNCTION static constexpr FragmentIndex b(int lane, int /*r*/) {
    return {lane % 4, lane / 4};
  }
  KOKKOS_INLINE_FUNCTION static constexpr FragmentIndex c(int lane, int r) {
    return {lane / 4, 2 * (lane % 4) + r};
  }
};

}  // namespace kdnn::impl
