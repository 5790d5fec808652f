// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Definition of kdnn::attention::impl::dropout (the forward and the backward
// apply the same mask to their input): one Philox call per four elements.
#include <cmath>

#include "kdnn/attention/dropout.hpp"
#include "kdnn/core/impl/philox.hpp"
#include "kdnn/core/validate.hpp"

namespace kdnn::attention::impl {

/// Words below this are dropped: round(p·2³²), at most 2³² − 1.
inline std::uint32_t drop_threshold(double p) {
  const double t = std::nearbyint(p * 4294967296.0);
  return t >= 4294967295.0 ? 0xffffffffu : std::uint32_t(t);
}

/// out = in·keep / (1 − p); `op`, `in_name` and `out_name` name the call and
/// its arguments in errors.
template <class ExecSpace, class T>
void dropout(const ExecSpace& space, const Tensor4<const T, ExecSpace>& in,
             const Tensor4<T, ExecSpace>& out, const DropoutOptions& opts, const char* op,
             const char* in_name, const char* out_name) {
  validate::in_half_open(op, "p", opts.p, 0.0, 1.0);
  validate::same_shape(op, out_name, out, in_name, in);
  validate::disjoint(op, {validate::memory_of(out_name, out)}, {validate::memory_of(in_name, in)});
  const std::size_t count = in.size();
  if (count == 0) return;
  const std::uint32_t threshold = drop_threshold(opts.p);
  const T scale = T(1.0 / (1.0 - opts.p));
  const std::uint32_t key0 = std::uint32_t(opts.seed), key1 = std::uint32_t(opts.seed >> 32);
  const std::uint32_t off0 = std::uint32_t(opts.offset), off1 = std::uint32_t(opts.offset >> 32);
  const T* x = in.data();
  T* y = out.data();
  Kokkos::parallel_for(
      "kdnn::attention::dropout", Kokkos::RangePolicy<ExecSpace>(space, 0, (count + 3) / 4),
      KOKKOS_LAMBDA(std::size_t g) {
        const kdnn::impl::Philox4x32 words = kdnn::impl::philox4x32_10(
            {{std::uint32_t(g), std::uint32_t(std::uint64_t(g) >> 32), off0, off1}}, key0, key1);
        for (int w = 0; w < 4; ++w) {
          const std::size_t k = 4 * g + w;
          if (k < count) y[k] = words.v[w] >= threshold ? x[k] * scale : T(0);
        }
      });
}

}  // namespace kdnn::attention::impl
