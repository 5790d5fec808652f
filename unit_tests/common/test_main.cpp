// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// GoogleTest main: Kokkos is initialised once for all tests (and MPI first,
// when kdnn is built with it).
#include <gtest/gtest.h>

#include <Kokkos_Core.hpp>
#ifdef KDNN_ENABLE_MPI
#include <mpi.h>
#endif

int main(int argc, char** argv) {
#ifdef KDNN_ENABLE_MPI
  MPI_Init(&argc, &argv);
#endif
  ::testing::InitGoogleTest(&argc, argv);
  int result = 0;
  Kokkos::initialize(argc, argv);
  result = RUN_ALL_TESTS();
  Kokkos::finalize();
#ifdef KDNN_ENABLE_MPI
  MPI_Finalize();
#endif
  return result;
}
