// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Must NOT compile: each KDNN_CASE passes a View an operator refuses, and
// ctest checks that the compiler reports kdnn's static_assert message
// (CMakeLists.txt: compile_fail tests).
#include "kdnn/sinkhorn/sinkhorn.hpp"

int main() {
  using Space = Kokkos::DefaultExecutionSpace;
  Kokkos::View<float***, Kokkos::LayoutRight, Space::memory_space> R("R", 2, 2, 2);
#if KDNN_CASE == 1  // a strided subview: LayoutStride
  Kokkos::View<float***, Kokkos::LayoutRight, Space::memory_space> big("big", 2, 4, 4);
  auto X = Kokkos::subview(big, Kokkos::ALL, Kokkos::make_pair(0, 2), Kokkos::make_pair(0, 2));
#elif KDNN_CASE == 2  // rank 2
  Kokkos::View<float**, Kokkos::LayoutRight, Space::memory_space> X("X", 2, 2);
#elif KDNN_CASE == 3  // int
  Kokkos::View<int***, Kokkos::LayoutRight, Space::memory_space> X("X", 2, 2, 2);
#endif
  kdnn::sinkhorn::forward(Space(), X, R);
  return 0;
}
