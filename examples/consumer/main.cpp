// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Smallest use of an installed kdnn: normalise one 3×3 matrix and check that
// its rows and columns sum to one. Built with kdnn::cp (KDNN_ENABLE_MPI), it
// runs under MPI.
#include <cmath>
#include <cstdio>

#include <Kokkos_Core.hpp>
#ifdef KDNN_ENABLE_MPI
#include <mpi.h>
#endif

#include <kdnn/config.hpp>
#include <kdnn/kdnn.hpp>

int main(int argc, char** argv) {
#ifdef KDNN_ENABLE_MPI
  MPI_Init(&argc, &argv);
#endif
  int status = 0;
  Kokkos::initialize(argc, argv);
  {
    using Space = Kokkos::DefaultExecutionSpace;
    kdnn::sinkhorn::Batch<double, Space> X("X", 1, 3, 3), R("R", 1, 3, 3);
    auto hx = Kokkos::create_mirror_view(X);
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 3; ++j) hx(0, i, j) = 0.5 * i - 0.25 * j * j;
    Kokkos::deep_copy(X, hx);
    kdnn::sinkhorn::forward(Space(), X, R, {200});
    auto hr = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), R);
    for (int k = 0; k < 3; ++k) {
      double row = 0, col = 0;
      for (int l = 0; l < 3; ++l) {
        row += hr(0, k, l);
        col += hr(0, l, k);
      }
      if (std::abs(row - 1) > 1e-12 || std::abs(col - 1) > 1e-12) status = 1;
    }
    std::printf("kdnn %s consumer (Kokkos %s, cp component %s): doubly stochastic %s\n",
                KDNN_VERSION_STRING, KDNN_KOKKOS_VERSION_STRING,
                KDNN_HAS_CP ? "built" : "not built", status == 0 ? "yes" : "NO");
  }
  Kokkos::finalize();
#ifdef KDNN_ENABLE_MPI
  MPI_Finalize();
#endif
  return status;
}
