// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Compile-time checks of an operator's View arguments, with plain messages
// (instead of a runtime abort in a View conversion, or an error deep inside
// Kokkos). ARG is a string literal naming the operation and the argument,
// e.g. "sinkhorn::forward: X".
//
// KDNN_CHECK_VIEW refuses LayoutStride Views (strided subviews): most
// operators read their tensors as contiguous row-major ones. Copy such a
// View into a LayoutRight one first (Kokkos::deep_copy). Subviews that keep
// LayoutRight (a range of the first index, ALL for the rest) are accepted.
// KDNN_CHECK_STRIDED_VIEW, for the operators that take strides, accepts
// both layouts (their last dimension's unit stride is checked at run time).
#include <type_traits>

#include <Kokkos_Core.hpp>

#define KDNN_CHECK_VIEW(ExecSpace, View, RANK, SHAPE, ARG)                                       \
  static_assert(Kokkos::is_view<View>::value, ARG " must be a Kokkos::View");                    \
  static_assert(unsigned(View::rank) == (RANK), ARG " must be a View of rank " #RANK " " SHAPE); \
  static_assert(std::is_same_v<typename View::array_layout, Kokkos::LayoutRight>, ARG            \
                " must be LayoutRight (contiguous, row-major); copy a LayoutStride "             \
                "View into a LayoutRight one first");                                            \
  static_assert(std::is_same_v<typename View::non_const_value_type, float> ||                    \
                    std::is_same_v<typename View::non_const_value_type, double>,                 \
                ARG " must hold float or double");                                               \
  static_assert(Kokkos::SpaceAccessibility<ExecSpace, typename View::memory_space>::accessible,  \
                ARG " is in a memory space the execution space cannot access");                  \
  static_assert(std::is_same_v<typename View::memory_space, typename ExecSpace::memory_space>,   \
                ARG " must be in the execution space's memory space (ExecSpace::memory_space)")

/// KDNN_CHECK_VIEW for an operator that takes any strides: LayoutRight or
/// LayoutStride.
#define KDNN_CHECK_STRIDED_VIEW(ExecSpace, View, RANK, SHAPE, ARG)                               \
  static_assert(Kokkos::is_view<View>::value, ARG " must be a Kokkos::View");                    \
  static_assert(unsigned(View::rank) == (RANK), ARG " must be a View of rank " #RANK " " SHAPE); \
  static_assert(std::is_same_v<typename View::array_layout, Kokkos::LayoutRight> ||              \
                    std::is_same_v<typename View::array_layout, Kokkos::LayoutStride>,           \
                ARG " must be LayoutRight or LayoutStride");                                     \
  static_assert(std::is_same_v<typename View::non_const_value_type, float> ||                    \
                    std::is_same_v<typename View::non_const_value_type, double>,                 \
                ARG " must hold float or double");                                               \
  static_assert(std::is_same_v<typename View::memory_space, typename ExecSpace::memory_space>,   \
                ARG " must be in the execution space's memory space (ExecSpace::memory_space)")

/// Requires an output View (non-const value type).
#define KDNN_CHECK_OUTPUT(View, ARG)                         \
  static_assert(!std::is_const_v<typename View::value_type>, \
                ARG " is an output: it must not be a View of const")

/// Requires two Views to hold the same scalar type.
#define KDNN_CHECK_SAME_TYPE(ViewA, ViewB, ARGS)                                                  \
  static_assert(                                                                                  \
      std::is_same_v<typename ViewA::non_const_value_type, typename ViewB::non_const_value_type>, \
      ARGS " must hold the same scalar type")
