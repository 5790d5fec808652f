// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The (execution space, scalar type) pairs compiled into libkdnn: float and
// double on Kokkos::DefaultExecutionSpace and, when it is another space (a
// GPU build), on Kokkos::DefaultHostExecutionSpace. KDNN_ETI_FOR_EACH(F)
// expands F(ExecSpace, T) once per pair; KDNN_ETI_FOR_EACH_16(F) once per
// pair of the same spaces with the 16-bit storage types (kdnn::bfloat16,
// kdnn::float16: core/float16.hpp), and KDNN_ETI_FOR_EACH_STORAGE(F) both,
// for the operators that take every storage type. Each family writes its operators'
// signatures once, in a macro taking (PREFIX, ExecSpace, T), and generates
// from it the template declarations, the `extern template` declarations of
// its public header and the explicit instantiations of its .cpp file.
// Other execution spaces instantiate from the headers on use.
#include <type_traits>

#include <Kokkos_Core.hpp>

#include "kdnn/core/float16.hpp"

#if defined(KOKKOS_ENABLE_DEFAULT_DEVICE_TYPE_SERIAL) ||  \
    defined(KOKKOS_ENABLE_DEFAULT_DEVICE_TYPE_OPENMP) ||  \
    defined(KOKKOS_ENABLE_DEFAULT_DEVICE_TYPE_THREADS) || \
    defined(KOKKOS_ENABLE_DEFAULT_DEVICE_TYPE_HPX)
#define KDNN_IMPL_DEFAULT_SPACE_IS_HOST 1
#define KDNN_IMPL_ETI_HOST(F)
#define KDNN_IMPL_ETI_HOST_16(F)
#else
#define KDNN_IMPL_DEFAULT_SPACE_IS_HOST 0
#define KDNN_IMPL_ETI_HOST(F) \
  F(Kokkos::DefaultHostExecutionSpace, float) F(Kokkos::DefaultHostExecutionSpace, double)
#define KDNN_IMPL_ETI_HOST_16(F)                       \
  F(Kokkos::DefaultHostExecutionSpace, kdnn::bfloat16) \
  F(Kokkos::DefaultHostExecutionSpace, kdnn::float16)
#endif

static_assert(std::is_same_v<Kokkos::DefaultExecutionSpace, Kokkos::DefaultHostExecutionSpace> ==
                  bool(KDNN_IMPL_DEFAULT_SPACE_IS_HOST),
              "kdnn: cannot tell whether Kokkos' default execution space is a host space");

#define KDNN_ETI_FOR_EACH(F)              \
  F(Kokkos::DefaultExecutionSpace, float) \
  F(Kokkos::DefaultExecutionSpace, double) KDNN_IMPL_ETI_HOST(F)

#define KDNN_ETI_FOR_EACH_16(F)                    \
  F(Kokkos::DefaultExecutionSpace, kdnn::bfloat16) \
  F(Kokkos::DefaultExecutionSpace, kdnn::float16) KDNN_IMPL_ETI_HOST_16(F)

#define KDNN_ETI_FOR_EACH_STORAGE(F) KDNN_ETI_FOR_EACH(F) KDNN_ETI_FOR_EACH_16(F)

/// PREFIX of the template declarations generated from a signature macro.
#define KDNN_TEMPLATE_EXEC_SPACE_T template <class ExecSpace, class T>
