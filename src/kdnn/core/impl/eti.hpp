// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The (execution space, scalar type) pairs compiled into libkdnn: float and
// double on Kokkos::DefaultExecutionSpace and, when it is another space (a
// GPU build), on Kokkos::DefaultHostExecutionSpace. KDNN_ETI_FOR_EACH(F)
// expands F(ExecSpace, T) once per pair. Each family writes its operators'
// signatures once, in a macro taking (PREFIX, ExecSpace, T), and generates
// from it the template declarations, the `extern template` declarations of
// its public header and the explicit instantiations of its .cpp file.
// Other execution spaces instantiate from the headers on use.
#include <type_traits>

#include <Kokkos_Core.hpp>

#if defined(KOKKOS_ENABLE_DEFAULT_DEVICE_TYPE_SERIAL) ||  \
    defined(KOKKOS_ENABLE_DEFAULT_DEVICE_TYPE_OPENMP) ||  \
    defined(KOKKOS_ENABLE_DEFAULT_DEVICE_TYPE_THREADS) || \
    defined(KOKKOS_ENABLE_DEFAULT_DEVICE_TYPE_HPX)
#define KDNN_IMPL_DEFAULT_SPACE_IS_HOST 1
#define KDNN_IMPL_ETI_HOST(F)
#else
#define KDNN_IMPL_DEFAULT_SPACE_IS_HOST 0
#define KDNN_IMPL_ETI_HOST(F) \
  F(Kokkos::DefaultHostExecutionSpace, float) F(Kokkos::DefaultHostExecutionSpace, double)
#endif

static_assert(std::is_same_v<Kokkos::DefaultExecutionSpace, Kokkos::DefaultHostExecutionSpace> ==
                  bool(KDNN_IMPL_DEFAULT_SPACE_IS_HOST),
              "kdnn: cannot tell whether Kokkos' default execution space is a host space");

#define KDNN_ETI_FOR_EACH(F)              \
  F(Kokkos::DefaultExecutionSpace, float) \
  F(Kokkos::DefaultExecutionSpace, double) KDNN_IMPL_ETI_HOST(F)

/// PREFIX of the template declarations generated from a signature macro.
#define KDNN_TEMPLATE_EXEC_SPACE_T template <class ExecSpace, class T>
