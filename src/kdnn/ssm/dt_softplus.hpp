// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// kdnn::ssm dt softplus, Mamba-2's step sizes:
//
//   dt_out[b,t,h] = clamp(softplus(dt[b,t,h] + dt_bias[h]), dt_min, dt_max)
//
// softplus(u) = log(1 + e^u), and u itself above 20 (PyTorch's threshold,
// as Mamba). The clamp is Mamba's dt_limit (default (0, ∞): no clamp); its
// gradient passes where dt_min ≤ softplus ≤ dt_max, as torch.clamp's. The
// backward gives d(dt) and d(dt_bias) = Σ over batch and steps, summed per
// block of rows and then over the blocks in a fixed order (deterministic).
//
// dt (and d(dt)) may be stored in any storage type T; dt_bias, dt_out, and
// their gradients are compute_t<T> (float for bfloat16 and float16), as
// mamba keeps them in fp32 under 16-bit activations (the SSD takes its dt in
// that type too).
#include <Kokkos_Core.hpp>
#include <limits>

#include "kdnn/core/float16.hpp"
#include "kdnn/core/impl/eti.hpp"
#include "kdnn/core/impl/space_lock.hpp"
#include "kdnn/core/tensor.hpp"

namespace kdnn::ssm {

struct DtSoftplusOptions {
  double dt_min = 0;                                        ///< lower clamp (not NaN)
  double dt_max = std::numeric_limits<double>::infinity();  ///< upper clamp, ≥ dt_min
  /// Refuse a NaN or an infinity in dt, dt_bias (and the backward's
  /// ddt_out), naming the first: a reduction over each that the host waits
  /// for. Without it they propagate, as in PyTorch (docs/api.md).
  bool check_finite = false;
};

}  // namespace kdnn::ssm

#define KDNN_DT_SOFTPLUS_OPERATORS(PREFIX, ExecSpace, T)                                           \
  PREFIX void dt_softplus_forward(const ExecSpace&, const Tensor3<const T, ExecSpace>&,            \
                                  const Vector<const compute_t<T>, ExecSpace>&,                    \
                                  const Tensor3<compute_t<T>, ExecSpace>&,                         \
                                  const DtSoftplusOptions&);                                       \
  PREFIX void dt_softplus_backward(                                                                \
      const ExecSpace&, const Tensor3<const T, ExecSpace>&,                                        \
      const Vector<const compute_t<T>, ExecSpace>&, const Tensor3<const compute_t<T>, ExecSpace>&, \
      const Tensor3<T, ExecSpace>&, const Vector<compute_t<T>, ExecSpace>&,                        \
      const DtSoftplusOptions&);

namespace kdnn::ssm {

namespace impl {
KDNN_DT_SOFTPLUS_OPERATORS(KDNN_TEMPLATE_EXEC_SPACE_T, ExecSpace, T)
#define KDNN_DT_SOFTPLUS_EXTERN(ExecSpace, T) \
  KDNN_DT_SOFTPLUS_OPERATORS(extern template, ExecSpace, T)
KDNN_ETI_FOR_EACH_STORAGE(KDNN_DT_SOFTPLUS_EXTERN)
#undef KDNN_DT_SOFTPLUS_EXTERN
}  // namespace impl

/// dt_out [B, L, H] from dt [B, L, H] and dt_bias [H] (LayoutRight Views in
/// the memory space of `space`, as kdnn::Tensor3 and kdnn::Vector: dt of any
/// storage type T, dt_bias and dt_out of compute_t<T>). Asynchronous on
/// `space` after the host-side checks.
template <class ExecSpace, class DtView, class BiasView, class OutView>
void dt_softplus_forward(const ExecSpace& space, const DtView& dt, const BiasView& dt_bias,
                         const OutView& dt_out, const DtSoftplusOptions& opts = {}) {
  const kdnn::impl::SpaceLock exclusive(space);
  using T = typename DtView::non_const_value_type;
  impl::dt_softplus_forward<ExecSpace, T>(space, dt, dt_bias, dt_out, opts);
}

/// ddt [B, L, H] (of dt's type) and ddt_bias [H] (overwritten) from the
/// forward's inputs and ddt_out = dL/d(dt_out) (of dt_out's type).
/// Asynchronous on `space` after the checks.
template <class ExecSpace, class DtView, class BiasView, class GView, class DView, class DBView>
void dt_softplus_backward(const ExecSpace& space, const DtView& dt, const BiasView& dt_bias,
                          const GView& ddt_out, const DView& ddt, const DBView& ddt_bias,
                          const DtSoftplusOptions& opts = {}) {
  const kdnn::impl::SpaceLock exclusive(space);
  using T = typename DView::non_const_value_type;
  impl::dt_softplus_backward<ExecSpace, T>(space, dt, dt_bias, ddt_out, ddt, ddt_bias, opts);
}

}  // namespace kdnn::ssm

#include "kdnn/ssm/impl/dt_softplus_impl.hpp"
