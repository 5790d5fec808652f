// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The tensor types kdnn's operators take: LayoutRight Views in an execution
// space's memory space, so that a PyTorch/NumPy contiguous buffer wraps as an
// unmanaged View with no copy. A default-constructed View (no data, every
// extent 0) stands for an optional argument that is not given.
#include <Kokkos_Core.hpp>

namespace kdnn {

template <class T, class ExecSpace>
using Vector = Kokkos::View<T*, Kokkos::LayoutRight, typename ExecSpace::memory_space>;
template <class T, class ExecSpace>
using Matrix = Kokkos::View<T**, Kokkos::LayoutRight, typename ExecSpace::memory_space>;
template <class T, class ExecSpace>
using Tensor3 = Kokkos::View<T***, Kokkos::LayoutRight, typename ExecSpace::memory_space>;
template <class T, class ExecSpace>
using Tensor4 = Kokkos::View<T****, Kokkos::LayoutRight, typename ExecSpace::memory_space>;

/// A 3-D tensor with any strides, for the operators that read a tensor in
/// place in other layouts (e.g. causal-conv1d's contiguous [B, C, L] seen
/// as [B, L, C]); a Tensor3 converts to it.
template <class T, class ExecSpace>
using StridedTensor3 = Kokkos::View<T***, Kokkos::LayoutStride, typename ExecSpace::memory_space>;

/// A 4-D tensor with any strides, for the operators that read a tensor in
/// place in other layouts (e.g. a PyTorch [B, S, H, D] tensor seen as
/// [B, H, S, D] through its strides). Those operators require the last
/// dimension to be contiguous (stride 1) and check it; a Tensor4 converts
/// to it.
template <class T, class ExecSpace>
using StridedTensor4 = Kokkos::View<T****, Kokkos::LayoutStride, typename ExecSpace::memory_space>;

}  // namespace kdnn
