// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// σ(z) = 1 / (1 + e^−z), shared by the SiLUs of the ssm family: the conv's
// (causal_conv1d_inputs.hpp) and the SSD's gate (ssd_around.hpp). SiLU(z) =
// z·σ(z), and its derivative σ(z)·(1 + z·(1 − σ(z))).
#include <Kokkos_Core.hpp>

#include "kdnn/core/impl/exp_vectorisable.hpp"

namespace kdnn::ssm::impl {

template <class T>
KOKKOS_FORCEINLINE_FUNCTION T sigmoid(T z) {
  return T(1) / (T(1) + kdnn::impl::exp_vectorisable(-z));
}

}  // namespace kdnn::ssm::impl
