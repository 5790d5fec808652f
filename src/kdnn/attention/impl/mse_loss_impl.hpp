// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Definitions of kdnn::attention::impl::{mse_loss, mse_loss_backward}.
#include <limits>

#include "kdnn/attention/mse_loss.hpp"
#include "kdnn/core/validate.hpp"

namespace kdnn::attention::impl {

template <class ExecSpace, class T>
double mse_loss(const ExecSpace& space, const Tensor3<const T, ExecSpace>& output,
                const Tensor3<const T, ExecSpace>& target) {
  constexpr const char* op = "attention::mse_loss";
  validate::same_shape(op, "target", target, "output", output);
  const std::size_t count = output.size();
  if (count == 0) return std::numeric_limits<double>::quiet_NaN();
  const T* o = output.data();
  const T* t = target.data();
  double sum = 0;
  Kokkos::parallel_reduce(
      "kdnn::attention::mse_loss", Kokkos::RangePolicy<ExecSpace>(space, 0, count),
      KOKKOS_LAMBDA(std::size_t k, double& s) {
        const double d = double(o[k]) - double(t[k]);
        s += d * d;
      },
      sum);
  return sum / double(count);
}

template <class ExecSpace, class T>
void mse_loss_backward(const ExecSpace& space, const Tensor3<const T, ExecSpace>& output,
                       const Tensor3<const T, ExecSpace>& target,
                       const Tensor3<T, ExecSpace>& d_output, double scale) {
  constexpr const char* op = "attention::mse_loss_backward";
  validate::same_shape(op, "target", target, "output", output);
  validate::same_shape(op, "d_output", d_output, "output", output);
  validate::finite(op, "scale", scale);
  const std::size_t count = output.size();
  if (count == 0) return;
  const T* o = output.data();
  const T* t = target.data();
  T* d = d_output.data();
  const T factor = T(2.0 * scale / double(count));
  // d may be output or target itself (written element by element after reading).
  Kokkos::parallel_for(
      "kdnn::attention::mse_loss_backward", Kokkos::RangePolicy<ExecSpace>(space, 0, count),
      KOKKOS_LAMBDA(std::size_t k) { d[k] = factor * (o[k] - t[k]); });
}

}  // namespace kdnn::attention::impl
