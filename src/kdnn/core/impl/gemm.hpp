// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// C = β·C + α·op(A)·op(B) for one pair of 2-D LayoutRight Views, through
// Kokkos Kernels' KokkosBlas::gemm: on a host whose Kokkos Kernels was built
// with a BLAS TPL (Debian's) that is the system BLAS — OpenBLAS once
// libopenblas0 is installed, through the libblas.so.3 alternative — and
// Kokkos Kernels' own kernels elsewhere (a GPU without the cuBLAS TPL,
// Kokkos Kernels 4 without TPLs).
//
// BLAS semantics, kept where Kokkos Kernels skips them: β = 0 ignores C's
// contents (NaN there does not propagate), and an empty inner dimension
// (k = 0) still scales C by β.
#include <KokkosBlas3_gemm.hpp>
#include <Kokkos_Core.hpp>

namespace kdnn::impl {

/// Views of a host or device pointer as a rows×cols row-major matrix.
template <class T, class MemorySpace>
using MatrixView =
    Kokkos::View<T**, Kokkos::LayoutRight, MemorySpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

/// op(M) = M (trans false) or Mᵀ.
inline const char* blas_op(bool trans) { return trans ? "T" : "N"; }

/// C = beta C + alpha op(A) op(B); shapes already checked by the caller.
/// Runs on `space` (Kokkos Kernels 4); Kokkos Kernels 3 has no execution-space
/// argument, so there the call is fenced on both sides.
template <class ExecSpace, class AV, class BV, class CV>
void gemm(const ExecSpace& space, bool trans_a, bool trans_b, typename CV::const_value_type alpha,
          const AV& A, const BV& B, typename CV::const_value_type beta, const CV& C) {
  using T = typename CV::non_const_value_type;
  const std::size_t k = trans_a ? A.extent(0) : A.extent(1);
  if (C.extent(0) == 0 || C.extent(1) == 0) return;
  if (k == 0) {  // C = beta C (beta = 0: zeros, whatever C held)
    Kokkos::parallel_for(
        "kdnn::gemm_scale",
        Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>>(space, {0, 0},
                                                          {C.extent(0), C.extent(1)}),
        KOKKOS_LAMBDA(std::size_t i, std::size_t j) {
          C(i, j) = beta == T(0) ? T(0) : beta * C(i, j);
        });
    return;
  }
#if defined(KOKKOSKERNELS_VERSION) && KOKKOSKERNELS_VERSION >= 40000
  KokkosBlas::gemm(space, blas_op(trans_a), blas_op(trans_b), alpha, A, B, beta, C);
#else
  space.fence();
  KokkosBlas::gemm(blas_op(trans_a), blas_op(trans_b), alpha, A, B, beta, C);
  Kokkos::fence();
#endif
}

}  // namespace kdnn::impl
